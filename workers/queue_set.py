"""A worker's queues: it is a member of every queue it may serve, at once, and serves them
all from one loop.

Each queue is a membership of its own (``TaskRun`` with a ``QueueLoop``: join, role, reclaim,
attempts, dead letters, leave, exactly as for one queue); this loop drives them together.
One round: every queue's safe point (a new epoch re-ranks that queue alone), the jobs each
holds (retries, reclaimed ones), then one read. The read is one ``XREADGROUP`` over every
queue's streams (they share the group name), with each queue's settle and, when due, its
membership check on the same pipeline: one round trip, however many queues (a read with
nothing else to carry is pre-built RESP on a kept connection: ``wire.StreamReads``). ``COUNT``
applies per stream, so a deep backlog in one queue does not crowd out another's jobs; what
comes is run round robin, one job of each queue in turn (fairness is per queue, not per
priority). On a Redis Cluster the queues' streams live on different slots: with more than
one queue, each is read on its own (not blocking) on one pipeline, and an empty round waits
``CLUSTER_WAIT`` (a job there may wait that long more; one queue's read blocks as usual).

Which queues: every queue ``Scout`` finds that this worker may serve. The loop ends when the
controller gives the worker a task (a task takes it whole: it leaves every queue first) or
the worker stops.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from queueworks import events
from queueworks.connection import text
from queueworks.keys import GROUP
from queueworks.records import queue_memberships
from queueworks.signals import ColdStop
from queueworks.vanished import gone_stream, stream_gone
from queueworks.wire import StreamReads

from .flow import RateGate
from .inflight import Call, InFlight
from .queue_loop import QueueLoop, halted
from .queue_scout import Scout
from .runtime import TaskRun, WorkerParts
from .work import Leave, Work

SCOUT_SECONDS = 0.5  # how often the worker looks for queues to join or leave
CLUSTER_WAIT = 0.01  # s an empty round waits on a cluster (no read there blocks)
REJOIN_SECONDS = 1.0  # a queue that turned us away (full, finished) is not tried sooner
COALESCE_JOBS = 8  # under load, a read that brought fewer jobs than this ...
COALESCE_SECONDS = 0.0005  # ... is followed by this pause before the next read


@dataclass
class Member:
    """One queue this worker is a member of: its run and its loop."""

    run: TaskRun
    loop: QueueLoop

    @property
    def name(self) -> str:
        return self.run.tk.task_id


class QueueSet:
    def __init__(self, parts: WorkerParts, scout: Scout) -> None:
        self.parts, self.scout = parts, scout
        self.r, self.me, self.log = parts.r, parts.state.worker_id, parts.log
        self.members: dict[str, Member] = {}
        # queues left while jobs of theirs still run here: read no more, closed once the
        # last of those jobs is recorded (leaving one queue waits for nothing else)
        self.leaving: dict[str, tuple[Member, str]] = {}
        self.closing = False  # leaving every queue at once (the worker stops or has a task)
        self.turned_away: dict[str, float] = {}  # queue -> when it last did (monotonic)
        self.scouted_at = float("-inf")
        self.published: list[str] | None = None  # the memberships the worker record shows
        self.turn = 0  # who goes first this round (round robin)
        self.cluster = hasattr(parts.r, "get_node_from_key")
        self.flight: Flight | None = None  # with --concurrency > 1
        # a read with nothing else to carry: pre-built on a kept connection (queueworks.wire)
        self.reads = StreamReads.of(parts.r, GROUP, self.me)

    # -- the loop -------------------------------------------------------------------------

    def serve(self) -> str:
        """Serve the queues until the worker has other work ("assigned") or stops
        ("stopping"); every membership is left on the way out."""
        state = self.parts.state
        flight = InFlight.of(self.parts)
        self.flight = Flight(self, flight) if flight is not None else None
        try:
            while not state.stopping and not state.assign:
                self._scout()
                if not self.members:
                    state.wake.wait(SCOUT_SECONDS)
                    state.wake.clear()
                    continue
                try:
                    if self.flight is not None:
                        self.flight.turn()
                    else:
                        self._round()
                except ResponseError as exc:
                    self._gone(exc)
        except ColdStop:  # what runs now has started: it stays ours, charged when reclaimed
            if self.flight is not None:
                self.flight.interrupted()
            raise
        finally:
            reason = "stopping" if state.stopping else "revoked"
            if self.flight is not None:
                self.flight.drain()  # the worker stops or is given a task: what runs ends
                self.flight.close()
            if self.reads is not None:
                self.reads.close()
            self.closing = True  # (the record says so once, at the end, not once a queue)
            try:
                for name in list(self.members):
                    self._close(name, reason)
                self.closed_left()
            finally:
                self.closing = False
            self._publish()
        return "stopping" if state.stopping else "assigned"

    def _round(self) -> None:
        for member in self._ordered():
            self._safe_point(member)
        held = [m for m in self._ordered() if m.run.held]
        for member in held:
            member.run.use()
            member.loop.run_held()
        if held or not self.members:
            return
        self._read_and_run()

    def _ordered(self) -> list[Member]:
        members = list(self.members.values())
        if not members:
            return members
        k = self.turn % len(members)
        return members[k:] + members[:k]

    def _safe_point(self, member: Member) -> None:
        """The queue's safe point and its duties; a queue whose run ends here is left."""
        member.run.use()
        try:
            member.run.check()
            member.loop.tick()
        except Leave as why:
            self._close(member.name, str(why))

    # -- reading --------------------------------------------------------------------------

    def _read_and_run(self) -> None:
        read, owner = self.read(block=True)
        if read:
            self._run(read, owner)
            self._coalesce(read)

    def _coalesce(self, read: Any) -> None:
        """Under load (a queue's settles carry ``BUSY_RATE`` jobs/s or more: ``busy``), a
        read that brought fewer than ``COALESCE_JOBS`` jobs is followed by a pause of
        ``COALESCE_SECONDS``: the jobs that come meanwhile are read together, not one read
        (and one wake-up) each. A job then starts at most that much later; a worker that
        cannot keep up reads full batches and never pauses, and a queue at a low rate is
        read at once."""
        n = sum(len(entries) for _, entries in read)
        if n < COALESCE_JOBS and any(m.loop.busy() for m in self.members.values()):
            time.sleep(COALESCE_SECONDS)

    def read(
        self, count: int | None = None, *, block: bool, most_ms: int | None = None
    ) -> tuple[Any, dict[str, Member]]:
        """One read over every queue's streams (``count`` each, or what each queue's jobs
        call for; waiting if ``block``, ``most_ms`` at most), carrying each queue's settle
        and checks when due: the reply and which member each stream is of. A rate-limited
        queue is read through its gate (``workers.flow``) on the same pipeline, when due."""
        now = time.monotonic()
        members = self._ordered()
        self.turn += 1
        plans = [(m, *m.loop.settle_now(now)) for m in members]
        wait = min(block_ms for _, _, block_ms in plans) if block else None
        if wait is not None and most_ms is not None:
            wait = min(wait, most_ms)
        count = count or min(m.loop.read_count() for m in members)
        streams: dict[Any, Any] = {}
        owner: dict[str, Member] = {}
        gated: list[RateGate] = []  # the rate-limited queues' gates due now
        for m in members:
            if m.loop.paused:  # a paused queue's streams are not read (its checks are)
                continue
            owner.update(dict.fromkeys(m.loop.aside.read, m))
            gate = m.loop.gate
            if gate is None:
                streams.update(m.loop.aside.read)
                continue
            if gate.due(now):
                gated.append(gate)
            if wait is not None:
                wait = min(wait, gate.block_ms(now))
        due = [(m, settle) for m, settle, _ in plans if settle or m.loop.check_due(now)]
        if self.cluster and len(members) > 1:  # (one queue's streams share its slot)
            return read_cluster(self, members, due, now, count), owner
        if not streams and not gated:
            self._idle(due, now, wait)
            return None, owner
        if not due and not gated:
            return self._xreadgroup(streams, count, wait), owner
        pipe = self.r.pipeline(transaction=False)
        looks = [m.loop.put_looks(pipe, now, settle) for m, settle in due]
        for gate in gated:
            gate.put(pipe, count)
        if streams:
            pipe.xreadgroup(GROUP, self.me, streams, count=count, block=wait)
        replies = pipe.execute(raise_on_error=False)
        for looked in looks:
            looked(replies)
        read: list[Any] = []
        for gate in gated:
            read += gate.took(replies, now)
        if streams:
            if isinstance(replies[-1], Exception):
                self._read_failed(replies[-1], members)
            else:
                read += replies[-1] or []
        elif not read and wait:
            self._gate_wait(wait)
        return read or None, owner

    def _gate_wait(self, wait: int) -> None:
        """Only gated queues were read, and brought nothing: wait for the first gate due
        (or the read's own wait)."""
        now = time.monotonic()
        gates = [m.loop.gate for m in self.members.values() if m.loop.gate is not None]
        ms = min([wait, *(g.block_ms(now) for g in gates)])
        self.parts.state.wake.wait(ms / 1000)
        self.parts.state.wake.clear()

    def _idle(self, due: list[tuple[Member, bool]], now: float, wait: int | None) -> None:
        """Every queue is paused: no read, only the settles and checks that are due, then
        the wait the read would have blocked for."""
        if due:
            pipe = self.r.pipeline(transaction=False)
            looks = [m.loop.put_looks(pipe, now, settle) for m, settle in due]
            replies = pipe.execute(raise_on_error=False)
            for looked in looks:
                looked(replies)
        if wait:
            self.parts.state.wake.wait(wait / 1000)
            self.parts.state.wake.clear()

    def _xreadgroup(self, streams: dict[Any, Any], count: int, block: int | None) -> Any:
        try:
            if self.reads is not None:
                return self.reads(streams, count, block)
            return self.r.xreadgroup(GROUP, self.me, streams, count=count, block=block)
        except ResponseError as exc:
            self._read_failed(exc, list(self.members.values()))
            return None

    def _read_failed(self, error: Exception, members: list[Member]) -> None:
        """A read over many queues failed. A queue's stream or group is gone (Redis lost
        its keys): that queue's membership went with it (``TaskRun.gone``). An aside
        stream was emptied and deleted meanwhile: each queue reads its own stream alone
        until its next look. Else the error is raised."""
        if self._gone(error, members, raises=False):
            return
        if not isinstance(error, ResponseError) or not any(
            len(m.loop.aside.read) > 1 for m in members
        ):
            raise error
        for m in members:
            if len(m.loop.aside.read) > 1:
                m.loop.aside.lost(time.monotonic())

    def _gone(
        self, error: Exception, members: list[Member] | None = None, *, raises: bool = True
    ) -> bool:
        """Redis says a stream or its group is gone (``error``): the queues of ``members``
        (default: all) whose own stream it is lost their membership with it
        (``TaskRun.gone``: the next safe point rejoins, or leaves if the queue is gone).
        Which: the one a ``NOGROUP`` names, or (a read that waited when its stream went
        says not which) those whose stream no longer exists. True if any did; else the
        error is raised (``raises``) or False."""
        found: list[Member] = []
        if stream_gone(error):
            members = list(self.members.values()) if members is None else members
            named = gone_stream(error)
            if named is not None:
                found = [m for m in members if m.run.tk.stream == named]
            else:
                pipe = self.r.pipeline(transaction=False)
                for m in members:
                    pipe.exists(m.run.tk.stream)
                there = pipe.execute()
                found = [m for m, n in zip(members, there, strict=True) if not n]
        for m in found:
            m.run.gone()
        if not found and raises:
            raise error
        return bool(found)

    # -- running ----------------------------------------------------------------------------

    def _run(self, read: Any, owner: dict[str, Member]) -> None:
        """What a read brought, one job of each queue in turn."""
        queues: dict[str, list[Work]] = {}
        for raw_stream, entries in read:
            stream = text(raw_stream)
            member = owner.get(stream)
            if member is None or member.name not in self.members:
                continue  # (left meanwhile: its entries stay pending, reclaimed by others)
            works = member.loop.aside.works([[raw_stream, entries]])
            if stream != member.run.tk.stream:  # an aside stream's: run as held ones
                member.run.held.extend(works)
                continue
            queues.setdefault(member.name, []).extend(works)
        lanes = [(self.members[name], works) for name, works in queues.items()]
        spent = {m.name: 0.0 for m, _ in lanes}
        ran = dict.fromkeys(spent, 0)
        while lanes:
            still = []
            for member, works in lanes:
                work = works.pop(0)
                member.run.use()
                started = time.monotonic()
                member.loop.batch_at = started
                if not member.loop.run_fresh_one(work):
                    member.run.held.extend(works)
                    continue
                spent[member.name] += time.monotonic() - started
                ran[member.name] += 1
                if works:
                    still.append((member, works))
            lanes = still
        for name, n in ran.items():
            if n and name in self.members:
                self.members[name].loop.ran_for(n, spent[name])

    def on_scheduled(self, key: str, event: str) -> None:
        """A keyspace notification of a queue's ``scheduled`` zset (the watcher's thread):
        a delayed job or a retry was added, so that queue's leader looks for due jobs now,
        however seldom its duties come round with many queues. After a reconnect (anything
        may have been missed) every queue looks."""
        if event == "resubscribed":
            for member in list(self.members.values()):
                member.loop.duties.poke()
            return
        if event != "zadd":
            return
        head, tail = self.parts.keys.task("\n").scheduled.split("\n")  # (around the name)
        if key.startswith(head) and key.endswith(tail):
            found = self.members.get(key[len(head) : len(key) - len(tail)])
            if found is not None:
                found.loop.duties.poke()

    def scheduled_pattern(self) -> str:
        """The keys ``on_scheduled`` is told about: every queue's ``scheduled`` zset."""
        return self.parts.keys.task("*").scheduled

    # -- joining and leaving ----------------------------------------------------------------

    def _scout(self) -> None:
        if time.monotonic() - self.scouted_at < SCOUT_SECONDS:
            return
        self.scouted_at = time.monotonic()
        wanted = self.scout.eligible()
        for name in list(self.members):
            if name not in wanted:
                self.members[name].run.state.revoke()
                self._close(name, "revoked")
        now = time.monotonic()
        for name in wanted:
            if name in self.members or name in self.leaving:
                continue
            if now - self.turned_away.get(name, -1e9) < REJOIN_SECONDS:
                continue
            self._open(name)
        for name in self.scout.take_touched():
            if name in self.members:
                self.members[name].loop.touched()
        self._publish()

    def _open(self, name: str) -> None:
        run = TaskRun(self.parts, name, queue=True)
        opened = run.open()
        if isinstance(opened, str) or not isinstance(opened, QueueLoop):
            run.end()
            self.turned_away[name] = time.monotonic()
            if not isinstance(opened, str):  # no queue after all (its mode): leave it
                run.close(opened, "revoked")
            return
        self.members[name] = Member(run, opened)
        self.turned_away.pop(name, None)

    def _close(self, name: str, reason: str) -> None:
        """Leave queue ``name``: at once, or, while jobs of its run here (a run never
        leaves with its jobs still running), once they are recorded; the other queues'
        jobs go on meanwhile."""
        member = self.members.pop(name, None)
        if member is None:
            return
        if self.flight is not None and self.flight.runs(member):
            self.leaving[name] = (member, reason)
            self._publish()
            return
        self._left(member, reason)

    def closed_left(self) -> None:
        """Close the queues left whose last job here has been recorded."""
        for name, (member, reason) in list(self.leaving.items()):
            if self.flight is None or not self.flight.runs(member):
                del self.leaving[name]
                self._left(member, reason)

    def _left(self, member: Member, reason: str) -> None:
        name = member.name
        member.run.use()
        try:
            member.run.close(member.loop, reason)
        finally:
            member.run.end()
        self.log.info("queue_left", queue=name, reason=reason)
        if reason in ("finished", "revoked"):
            self.turned_away[name] = time.monotonic()
        if not self.closing:
            self._publish()

    def _publish(self) -> None:
        """The worker record shows the queues we are a member of (when that changes)."""
        names = sorted(self.members)
        if names == self.published:
            return
        for member in self.members.values():
            member.loop.spread(len(names))
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.parts.keys.worker(self.me), mapping=queue_memberships(names))
        events.emit(pipe, self.parts.keys, "memberships", worker=self.me, queues=",".join(names))
        pipe.execute()
        self.published = names


def read_cluster(
    queues: QueueSet, members: list[Member], due: list[tuple[Member, bool]], now: float, count: int
) -> Any:
    """``QueueSet.read`` on a cluster: each queue's streams on their own, on one cluster
    pipeline, none blocking."""
    pipe = queues.r.pipeline(transaction=False)
    looks = [m.loop.put_looks(pipe, now, settle) for m, settle in due]
    at = len(pipe)
    reading = [m for m in members if not m.loop.paused and m.loop.gate is None]
    gated = [
        m.loop.gate
        for m in members
        if not m.loop.paused and m.loop.gate is not None and m.loop.gate.due(now)
    ]
    for m in reading:
        pipe.xreadgroup(GROUP, queues.me, m.loop.aside.read, count=count)
    for gate in gated:  # (a cluster pipeline runs each at once)
        gate.put(pipe, count)
    replies = pipe.execute(raise_on_error=False)
    for looked in looks:
        looked(replies)
    read: list[Any] = []
    for m, reply in zip(reading, replies[at : at + len(reading)], strict=True):
        if isinstance(reply, Exception):
            m.loop.read_failed(reply)
        elif reply:
            read += reply
    for gate in gated:
        read += gate.took(replies, now)
    if not read:
        queues.parts.state.wake.wait(CLUSTER_WAIT)
        queues.parts.state.wake.clear()
    return read


WAIT_SECONDS = 0.02  # how long a turn waits for a call to finish before looking around
FLUSH_SECONDS = 0.05  # settle at least this often while calls run


class Flight:
    """``--concurrency N`` over all of a worker's queues: up to N jobs in flight at once,
    whichever queues they are of (``workers.concurrent`` does the same for one run). Jobs
    start round robin over the queues that hold some; before any queue's membership
    change is acted on, nothing waits: a queue's re-rank hands back nothing, so what runs
    goes on. Only the worker's own end in a queue waits for what is in flight there: it
    stops, is given a task, or was pruned (it hands back what it holds, then rejoins)."""

    def __init__(self, queues: QueueSet, flight: InFlight) -> None:
        self.queues, self.flight = queues, flight
        self.owners: dict[int, Member] = {}  # id(call) -> the queue it is of

    def turn(self) -> None:
        queues, flight = self.queues, self.flight
        if flight.running and (
            queues.parts.state.stopping or any(map(_halted, queues.members.values()))
        ):
            self.drain()
        for member in queues._ordered():
            queues._safe_point(member)
        self._record(flight.collect(0))
        self._start_held()
        held = sum(len(m.run.held) for m in queues.members.values())
        waited = False
        if flight.free and held < flight.free and queues.members:
            # blocked on the streams even while calls run (up to WAIT_SECONDS: a call that
            # ends meanwhile is recorded that much later), so a free slot takes a job as
            # soon as it comes, not at the next poll: fair among the members of a queue
            waited = not held
            most = int(WAIT_SECONDS * 1000) if flight.running else None
            read, owner = queues.read(flight.free, block=not held, most_ms=most)
            for raw_stream, entries in read or ():
                of = owner.get(text(raw_stream))
                if of is not None and of.name in queues.members:
                    of.run.held.extend(of.loop.aside.works([[raw_stream, entries]]))
            self._start_held()
        if flight.running:
            self._record(flight.collect(0 if waited else WAIT_SECONDS))
        for member in queues.members.values():
            if time.monotonic() > member.loop.ledger.last_flush + FLUSH_SECONDS:
                member.loop.ledger.flush()

    def _start_held(self) -> None:
        """Start what the queues hold, one job of each in turn, while there is room."""
        flight = self.flight
        lanes: deque[Member] = deque(m for m in self.queues._ordered() if m.run.held)
        while lanes and flight.free:
            member = lanes.popleft()
            started = member.loop.ledger.start(member.run.held.popleft())
            if member.run.held:
                lanes.append(member)
            if started is None:
                continue
            member.run.use()
            call = member.loop.call_for(started)
            if call is not None:
                self.owners[id(call)] = member
                flight.start(call, member.run.spec.subtask_timeout)
        flight.launch()

    def _record(self, calls: list[Call]) -> None:
        for call in calls:
            member = self.owners.pop(id(call))
            member.loop.record(call)
        if calls and self.queues.leaving:
            self.queues.closed_left()

    def runs(self, member: Member) -> bool:
        """Whether a job of ``member``'s queue is in flight here."""
        return any(owner is member for owner in self.owners.values())

    def drain(self) -> None:
        """Start nothing more; wait for everything in flight and record it."""
        while self.flight.running:
            self._record(self.flight.collect(0.05))
        for member in self.queues.members.values():
            member.loop.ledger.flush()

    def interrupted(self) -> None:
        """A cold stop: what runs has started; it stays ours, charged when reclaimed."""
        for key, call in self.flight.running.items():
            member = self.owners.get(key)
            if member is not None:
                member.loop.ledger.interrupted.add(call.item.entry_id)

    def close(self) -> None:
        self.flight.close()


def _halted(member: Member) -> bool:
    """The worker ends its membership of this queue for a reason that ends what it runs
    (``queue_loop.halted``): drain first. A new epoch is none."""
    return halted(member.run.state)
