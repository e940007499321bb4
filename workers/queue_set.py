"""A worker's queues: it is a member of every queue it may serve, at once, and serves them
all from one loop.

Each queue is a membership of its own (``TaskRun`` with a ``QueueLoop``: join, role, reclaim,
attempts, dead letters, leave, exactly as for one queue); this loop drives them together.
One round: the round's queues (``workers.ready``: every one with few queues; with many,
those that may have jobs or need a look), their re-ranks (a new epoch: rosters read for
all of them in one MULTI), their safe points, the jobs each holds (retries, reclaimed
ones), then one read. The read is one ``XREADGROUP`` over the round's queues' streams
(they share the group name), with each queue's settle and, when due, its membership check
on the same pipeline: one round trip, however many queues (a read with nothing else to
carry is pre-built RESP on a kept connection: ``wire.StreamReads``). ``COUNT``
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import ResponseError

from queueworks.process import ColdStop
from queueworks.protocol import events
from queueworks.protocol.keys import GROUP
from queueworks.protocol.messages import text
from queueworks.protocol.records import queue_memberships
from queueworks.queue.vanished import gone_stream, stream_gone
from queueworks.transport.topology import slot_of
from queueworks.transport.unblock import ReadWaker, pool_client_id
from queueworks.transport.wire import StreamReads

from .flow_gate import BandGate, RateGate
from .inflight import Call, InFlight
from .queue_loop import BLOCK_MS, QueueLoop, halted
from .queue_scout import Scout
from .ready import FEW, Ready, name_in, queue_of, streams_of
from .runtime import TaskRun, WorkerParts
from .weights import Weights
from .work import Leave, Work

SCOUT_SECONDS = 0.5  # how often the worker looks for queues to join or leave
CLUSTER_WAIT = 0.01  # s an empty round waits on a cluster (no read there blocks)
REJOIN_SECONDS = 1.0  # a queue that turned us away (full, finished) is not tried sooner
COALESCE_JOBS = 8  # under load, a read that brought fewer jobs than this ...
COALESCE_SECONDS = 0.0005  # ... is followed by this pause before the next read
# a read that would block less than this (the settle's short wait) does not block: Redis
# ends a blocking command's wait only when its event loop next wakes (up to 1/hz: 100 ms
# by default) if nothing else comes, and a reader that re-sends its read goes to the back
# of the stream's waiting readers; it reads at once, then waits here, on the wake event
LOCAL_WAIT_MS = 10


@dataclass
class Member:
    """One queue this worker is a member of: its run and its loop."""

    run: TaskRun
    loop: QueueLoop

    @property
    def name(self) -> str:
        return self.run.tk.task_id


class QueueSet:
    def __init__(self, parts: WorkerParts, scout: Scout, weights: Weights | None = None) -> None:
        self.parts, self.scout = parts, scout
        self.weights = weights or Weights()  # (``--queues high:3,default:1``)
        self.busy = False  # the last read brought jobs
        self.r, self.me, self.log = parts.r, parts.state.worker_id, parts.log
        self.members: dict[str, Member] = {}
        # queues left while jobs of theirs still run here: read no more, closed once the
        # last of those jobs is recorded (leaving one queue waits for nothing else)
        self.leaving: dict[str, tuple[Member, str]] = {}
        self.closing = False  # leaving every queue at once (the worker stops or has a task)
        self.turned_away: dict[str, float] = {}  # queue -> when it last did (monotonic)
        self.scouted_at = float("-inf")
        self.scouted = -1  # the scout's ``changes`` when its queues were last compared with ours
        self.joins = 0  # bumped whenever ``members`` changes (a queue joined or left)
        self.published_joins = -1  # ``joins`` when the worker record was last written
        self.published: list[str] | None = None  # the memberships the worker record shows
        self.turn = 0  # who goes first this round (round robin)
        self.cluster = hasattr(parts.r, "get_node_from_key")
        self.flight: Flight | None = None  # with --concurrency > 1
        self.waker: ReadWaker | None = None  # ... ends a waiting read when a call ends
        # a read with nothing else to carry: pre-built on a kept connection
        # (queueworks.transport.wire)
        self.reads = StreamReads.of(parts.r, GROUP, self.me)
        # which queues a round looks at and reads (``workers.ready``): all, or with many
        # queues and stream notifications, those that may have jobs
        self.ready = Ready(parts.state.wake)
        parts.state.on_flagged = self.ready.flag
        self.selective = False
        self.visiting: list[Member] = []  # this round's queues
        self.read_names: set[str] = set()  # of those, the ones this round's read named
        self.brought: set[str] = set()  # ... and the ones it brought jobs of
        # subscribe to (True) or drop (False) the queue streams' notifications; True if
        # they come (the worker's, ``Worker._listen``)
        self.listen: Callable[[bool], bool] = lambda on: False

    # -- the loop -------------------------------------------------------------------------

    def serve(self) -> str:
        """Serve the queues until the worker has other work ("assigned") or stops
        ("stopping"); every membership is left on the way out."""
        state = self.parts.state
        flight = InFlight.of(self.parts)
        self.flight = Flight(self, flight) if flight is not None else None
        if flight is not None:
            self.waker = ReadWaker(self.r, state.wake, flight.ended, self.log)
            flight.on_end(self.waker.wake)
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
        self.rerank(self.choose_visits())
        for member in self.visiting:
            self.safe_point(member)
        held = [m for m in self.visiting if m.run.held and m.name in self.members]
        for member in held:
            member.run.use()
            member.loop.run_held()
        if not held and self.members:
            self._read_and_run()
        self.note_round()

    def in_turn(self) -> list[Member]:
        """This round's queues, who goes first turning each round (round robin)."""
        members = self.visiting
        if not members:
            return members
        k = self.turn % len(members)
        return members[k:] + members[:k]

    def choose_visits(self) -> list[Member]:
        """Choose this round's queues (``workers.ready``): every one, or with many queues
        and stream notifications, those that may have jobs or need a look."""
        self.read_names, self.brought = set(), set()
        if self.ready.recheck:  # the watcher reconnected: notifications may be off now
            self.ready.recheck = False
            self.ready.listening = self.listen(len(self.members) > FEW and not self.cluster)
        self.selective = self.ready.selective(len(self.members))
        for name in self.ready.flagged(poke=self.selective):
            found = self.members.get(name)
            if found is not None:
                found.loop.touched()  # (a new epoch, a prune: its next read checks it)
        if not self.selective:
            self.visiting = list(self.members.values())
            return self.visiting
        names = self.ready.take(time.monotonic())
        members = self.members
        self.visiting = [members[n] for n in names if n in members]
        return self.visiting

    def note_round(self) -> None:
        """Note what this round found of each queue it looked at: read again next round
        (it brought jobs), looked at every round (it holds work here, or its seat is
        flagged: a new epoch, a prune)."""
        if not self.selective:
            return
        ready, flight = self.ready, self.flight
        now = time.monotonic()
        for m in self.visiting:
            if m.name not in self.members:
                continue
            loop, run = m.loop, m.run
            busy = (
                bool(run.held)
                # its check is still due (a round that ran held jobs made no read, and the
                # check rides on the read): a queue poked for a new epoch keeps its turn
                or loop.check_due(now)
                or loop.ledger.pending()
                or loop.gate is not None
                or len(loop.aside.read) > 1
                or loop.slots is not None
                or loop.duties.next_due is not None
                or (flight is not None and flight.runs(m))
                or run.state.suspend.is_set()  # (a new epoch, a prune: the next round acts)
                or run.state.fenced
            )
            read = m.name in self.read_names
            ready.after(m.name, read=read, brought=m.name in self.brought, busy=busy)

    def rerank(self, members: list[Member]) -> None:
        """The queues of ``members`` whose members changed (a new epoch) take their new
        roles now, their rosters (and their streams' consumers, for the leader's take-over)
        read for all of them in one MULTI (on a cluster, one for each slot): a worker
        joining or dying costs each other member one round trip for all the queues they
        share, not a few for each."""
        due = [m for m in members if m.name in self.members and _rerank_due(m)]
        if self.cluster:  # a MULTI holds one slot's keys: one per slot
            slots: dict[int, list[Member]] = {}
            for m in due:
                slots.setdefault(slot_of(m.run.tk.record), []).append(m)
            for together in slots.values():
                self._rerank(together)
        else:
            self._rerank(due)

    def _rerank(self, due: list[Member]) -> None:
        if len(due) < 2:
            return  # (one: its safe point re-ranks it, as alone)
        pipe = self.r.pipeline(transaction=True)
        reads = []
        for m in due:
            looked: dict[str, Any] = {}
            roster = m.run.membership.roster_on(pipe)
            consumers = m.run.reclaim.consumers_on(pipe, m.run.streams, looked)
            reads.append((m, roster, consumers, looked))
        sent = time.monotonic()
        replies = pipe.execute(raise_on_error=False)
        for m, roster, consumers, looked in reads:
            try:
                read = (roster(replies), sent)
                consumers(replies)
            except ResponseError:
                continue  # (its safe point re-ranks it, alone)
            m.run.use()
            try:
                m.run.rerank(looked=looked, read=read)
            except Leave as why:
                self._close(m.name, str(why))

    def safe_point(self, member: Member) -> None:
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
        if n < COALESCE_JOBS and any(m.loop.busy() for m in self.visiting):
            time.sleep(COALESCE_SECONDS)

    def read(
        self, count: int | None = None, *, block: bool, most_ms: int | None = None
    ) -> tuple[Any, dict[str, Member]]:
        """One read over every queue's streams (``count`` each, or what each queue's jobs
        call for; waiting if ``block``, ``most_ms`` at most), carrying each queue's settle
        and checks when due: the reply and which member each stream is of. A rate-limited
        queue is read through its gate (``workers.flow``) on the same pipeline, when due.
        Only this round's queues (``choose_visits``); reading some of many, the read never blocks
        on the streams: it waits on the wake event, which a stream's notification sets."""
        now = time.monotonic()
        members = [m for m in self.in_turn() if m.name in self.members]  # (none left)
        self.turn += 1
        if not members:
            self._idle([], now, most_ms if most_ms is not None else (BLOCK_MS if block else 0))
            return None, {}
        plans = [(m, *m.loop.settle_now(now)) for m in members]
        wait = min(block_ms for _, _, block_ms in plans) if block else None
        if wait is not None and most_ms is not None:
            wait = min(wait, most_ms)
        idle_wait = None
        if wait is not None and (self.selective or wait < LOCAL_WAIT_MS):
            idle_wait, wait = wait, None
        count = count or min(m.loop.read_count() for m in members)
        streams: dict[Any, Any] = {}
        owner: dict[str, Member] = {}
        gated: list[RateGate] = []  # the rate-limited queues' gates due now
        ordered: list[BandGate] = []  # the queues read highest priority first, this round
        banded = False  # a queue's jobs use priority bands (a read of it may wake its gate)
        resting: set[str] = set()
        if self.weights.weights:
            resting = self.weights.resting([m.name for m in members], self.busy)
        if resting:
            wait = None  # (the others' read brings jobs, or the next round reads all)
        for m in members:
            loop = m.loop
            if loop.paused or (resting and m.name in resting):  # not read (its checks are)
                continue
            reads = streams_of(loop)
            owner.update(dict.fromkeys(reads, m))
            gate = loop.gate
            if gate is None:
                self.read_names.add(m.name)
                if loop.aside.bands:  # its jobs use priorities: read in order while jobs come
                    if loop.bands.ordered():
                        ordered.append(loop.bands)
                        continue
                    banded = True
                streams.update(reads)
                continue
            if gate.due(now):
                gated.append(gate)
            if wait is not None:
                wait = min(wait, gate.block_ms(now))
        if ordered:
            wait = None  # (jobs may wait there: the others' read does not block)
        due = [(m, settle) for m, settle, _ in plans if settle or m.loop.check_due(now)]
        if self.cluster and len(members) > 1:  # (one queue's streams share its slot)
            return read_cluster(self, members, due, now, count), owner
        if not streams and not gated and not ordered:
            self._idle(due, now, wait if idle_wait is None else idle_wait)
            self.busy = False
            return None, owner
        if not due and not gated and not ordered:
            alone = self._xreadgroup(streams, count, wait)
            if banded and alone:
                woke(alone, owner)
            return self._brought(alone, owner, idle_wait), owner
        pipe = self.r.pipeline(transaction=False)
        looks = [m.loop.put_looks(pipe, now, settle) for m, settle in due]
        for gate in gated:
            gate.put(pipe, count)
        for bands in ordered:
            bands.put(pipe, count)
        try:
            if streams:
                waits = self._pinned(pipe, wait)
                pipe.xreadgroup(GROUP, self.me, streams, count=count, block=waits)
            replies = pipe.execute(raise_on_error=False)
        finally:
            if self.waker is not None:
                self.waker.done()
        for looked in looks:
            looked(replies)
        read: list[Any] = []
        for gate in gated:
            read += gate.took(replies, now)
        for bands in ordered:
            read += bands.took(replies)
        if streams:
            if isinstance(replies[-1], Exception):
                self._read_failed(replies[-1], members)
            elif replies[-1]:
                if banded:
                    woke(replies[-1], owner)
                read += replies[-1]
        elif not read and wait:
            self._gate_wait(wait)
        return self._brought(read or None, owner, idle_wait), owner

    def _brought(self, read: Any, owner: dict[str, Member], idle_wait: int | None) -> Any:
        """Note which queues ``read`` brought jobs of; reading some of many and nothing
        came, wait ``idle_wait`` ms on the wake event (a stream's notification sets it)."""
        self.busy = bool(read)  # (queue weights: ``workers.weights``)
        if read:
            for raw_stream, entries in read:
                member = owner.get(text(raw_stream))
                if member is not None and entries:
                    self.brought.add(member.name)
        elif idle_wait:
            self.parts.state.wake.wait(idle_wait / 1000)
            self.parts.state.wake.clear()
        return read

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
                return self.reads(streams, count, block, self.waker)
            if self.waker is None or block is None or self.cluster:
                return self.r.xreadgroup(GROUP, self.me, streams, count=count, block=block)
            pipe = self.r.pipeline(transaction=False)
            try:
                block = self._pinned(pipe, block)
                pipe.xreadgroup(GROUP, self.me, streams, count=count, block=block)
                return pipe.execute()[0]
            finally:
                self.waker.done()
        except ResponseError as exc:
            self._read_failed(exc, list(self.members.values()))
            return None

    def woken(self) -> bool:
        """Whether a call that ends ends the read's wait (``waker``): not on a cluster,
        nor where the server refused ``CLIENT UNBLOCK``."""
        return self.waker is not None and self.waker.allowed and not self.cluster

    def _pinned(self, pipe: Any, wait: int | None) -> int | None:
        """The wait of the read that ends ``pipe``: with calls in flight (``waker``) the
        pipe gets its connection now, so that a call that ends can end the wait
        (``queueworks.transport.unblock``); no wait if one ended already. The caller tells
        the waker ``done`` after the read, or if this raises."""
        if wait is None or self.waker is None or not isinstance(self.r, Redis):
            return wait  # (on a cluster the turn's wait is short: ``Flight.turn``)
        try:
            pipe.connection = self.r.connection_pool.get_connection()
            return wait if self.waker.blocking(pool_client_id(pipe.connection)) else None
        except BaseException:
            pipe.reset()  # (gives the connection back)
            raise

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
            if stream != member.run.tk.stream and member.loop.aside.is_aside(stream):
                # an aside stream's: run as held ones (a band's runs in the read's order)
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
        name = name_in(key, lambda q: self.parts.keys.task(q).scheduled)
        found = self.members.get(name) if name is not None else None
        if found is not None:
            found.loop.duties.poke()
            self.ready.flag(found.name)  # (its duties come with a look at it)

    def scheduled_pattern(self) -> str:
        """The keys ``on_scheduled`` is told about: every queue's ``scheduled`` zset."""
        return self.parts.keys.task("*").scheduled

    def on_stream(self, key: str, event: str) -> None:
        """A keyspace notification of a queue's stream (the watcher's thread): a job was
        added (``xadd``), so that queue is read next round. After a reconnect (anything may
        have been missed) every queue is."""
        if event == "resubscribed":  # (maybe another server now: does it send them?)
            self.ready.recheck = True
            self.ready.told(None)
        elif event == "xadd" and (found := queue_of(self.parts.keys, key)) is not None:
            name, kind = found
            member = self.members.get(name) if kind == "band" else None
            if member is not None and not member.loop.aside.reads_stream(key):
                # a band new to this member: its next check reads the bands set (else that
                # look would come only with the queue's capped checks, seconds apart with
                # many queues)
                member.loop.aside.stale()
                self.ready.flag(member.name)
            self.ready.told(name)

    def stream_patterns(self) -> list[str]:
        """The keys ``on_stream`` is told about: every queue's stream, and its priority
        bands' streams."""
        tk = self.parts.keys.task("*")
        return [tk.stream, tk.band_pattern]

    def on_epoch(self, key: str) -> None:
        """A keyspace notification of a queue's epoch (the watcher's thread): its members
        changed; its next read checks it."""
        name = name_in(key, lambda q: self.parts.keys.task(q).epoch)
        if name is not None and name in self.members:
            self.ready.flag(name)

    # -- joining and leaving ----------------------------------------------------------------

    def _scout(self) -> None:
        if time.monotonic() - self.scouted_at < SCOUT_SECONDS:
            return
        self.scouted_at = time.monotonic()
        keep = self.scout.eligible()
        if self.scout.changes != self.scouted:  # (else no member is outside it: none to revoke)
            self.scouted = self.scout.changes
            for name in list(self.members):
                if name not in keep:
                    self.members[name].run.state.revoke()
                    self._close(name, "revoked")
        now = time.monotonic()
        if len(self.members) < len(keep):  # (else every queue wanted is one of ours)
            for name in sorted(keep):
                if name in self.members or name in self.leaving:
                    continue
                if now - self.turned_away.get(name, -1e9) < REJOIN_SECONDS:
                    continue
                self._open(name)
        for name in self.scout.take_touched():
            if name in self.members:
                self.members[name].loop.touched()
                self.ready.poke(name)
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
        self.joins += 1
        self.turned_away.pop(name, None)

    def _close(self, name: str, reason: str) -> None:
        """Leave queue ``name``: at once, or, while jobs of its run here (a run never
        leaves with its jobs still running), once they are recorded; the other queues'
        jobs go on meanwhile."""
        member = self.members.pop(name, None)
        self.joins += member is not None
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
        if self.joins == self.published_joins:
            return
        joins, names = self.joins, sorted(self.members)
        if names == self.published:
            self.published_joins = joins
            return
        self.ready.serve(names)
        want = len(names) > FEW and not self.cluster
        if want != self.ready.listening:
            self.ready.listening = self.listen(want)
            if self.ready.listening:
                self.ready.told(None)  # (what came before the subscription: read it all once)
        told = self.ready.selective(len(names))
        for member in self.members.values():
            member.loop.spread(len(names), told=told)
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.parts.keys.worker(self.me), mapping=queue_memberships(names))
        events.emit(pipe, self.parts.keys, "memberships", worker=self.me, queues=",".join(names))
        pipe.execute()
        self.published, self.published_joins = names, joins


def woke(read: Any, owner: dict[str, Member]) -> None:
    """A read with the others brought jobs of these queues: those with bands read them
    in order again (``BandGate``)."""
    for raw_stream, entries in read:
        member = owner.get(text(raw_stream))
        if member is not None and entries:
            member.loop.bands.woke()


def read_cluster(
    queues: QueueSet, members: list[Member], due: list[tuple[Member, bool]], now: float, count: int
) -> Any:
    """``QueueSet.read`` on a cluster: each queue's streams on their own, on one cluster
    pipeline, none blocking."""
    pipe = queues.r.pipeline(transaction=False)
    looks = [m.loop.put_looks(pipe, now, settle) for m, settle in due]
    at = len(pipe)
    reading = [m for m in members if not m.loop.paused and m.loop.gate is None]
    ordered = [m.loop.bands for m in reading if m.loop.bands.ordered()]
    reading = [m for m in reading if not m.loop.bands.ordered()]
    gated = [
        m.loop.gate
        for m in members
        if not m.loop.paused and m.loop.gate is not None and m.loop.gate.due(now)
    ]
    for m in reading:
        pipe.xreadgroup(GROUP, queues.me, m.loop.aside.read, count=count)
    for gate in gated:  # (a cluster pipeline runs each at once)
        gate.put(pipe, count)
    for bands in ordered:  # (likewise)
        bands.put(pipe, count)
    replies = pipe.execute(raise_on_error=False)
    for looked in looks:
        looked(replies)
    read: list[Any] = []
    for m, reply in zip(reading, replies[at : at + len(reading)], strict=True):
        if isinstance(reply, Exception):
            m.loop.read_failed(reply)
        elif reply:
            if m.loop.aside.bands:
                woke(reply, {text(stream): m for stream, _ in reply})
            read += reply
    for gate in gated:
        read += gate.took(replies, now)
    for bands in ordered:
        read += bands.took(replies)
    if not read:
        queues.parts.state.wake.wait(CLUSTER_WAIT)
        queues.parts.state.wake.clear()
    return read


WAIT_SECONDS = 0.02  # how long a turn waits for a call to finish before looking around
# (and how long its read waits while calls run where no call can end it: ``QueueSet.woken``)
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
        visiting = queues.choose_visits()
        if flight.running and (queues.parts.state.stopping or any(map(_halted, visiting))):
            self.drain()
        queues.rerank(visiting)
        for member in queues.visiting:
            queues.safe_point(member)
        self._record(flight.collect(0))
        self._start_held()
        held = sum(len(m.run.held) for m in queues.visiting)
        waited = False
        if flight.free and held < flight.free and queues.members:
            # blocked on the streams even while calls run (a call that ends ends the wait:
            # ``QueueSet.waker``), so a free slot takes a job as soon as it comes, and the
            # read keeps its place among the queue's waiting readers: fair among the
            # members of a queue
            waited = not held
            most = int(WAIT_SECONDS * 1000) if flight.running and not queues.woken() else None
            read, owner = queues.read(flight.free, block=not held, most_ms=most)
            for raw_stream, entries in read or ():
                of = owner.get(text(raw_stream))
                if of is not None and of.name in queues.members:
                    of.run.held.extend(of.loop.aside.works([[raw_stream, entries]]))
            self._start_held()
        if flight.running:
            self._record(flight.collect(0 if waited else WAIT_SECONDS))
        for member in queues.visiting:
            if time.monotonic() > member.loop.ledger.last_flush + FLUSH_SECONDS:
                member.loop.ledger.flush()
        queues.note_round()

    def _start_held(self) -> None:
        """Start what the queues hold, one job of each in turn, while there is room."""
        flight = self.flight
        queues = self.queues
        lanes: deque[Member] = deque(
            m for m in queues.in_turn() if m.run.held and m.name in queues.members
        )
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


def _rerank_due(member: Member) -> bool:
    """Whether the member's next safe point would re-rank its queue, and do nothing else
    first (``TaskRun.check``: no leave, no rejoin)."""
    run = member.run
    s = run.state
    return (
        s.suspend.is_set()
        and not s.fenced
        and not s.stopping
        and s.assign == run.tk.task_id
        and not run.ledger.ended
        and run.membership.role is not None
    )
