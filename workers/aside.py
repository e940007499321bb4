"""A queue's jobs that wait alone: a member that reads a job whose handler it may not run
(outside its ``--allow``) sets it aside (``set_aside.lua``) instead of leaving the queue.
The job moves, in one atomic step, from the queue's stream to its handler's aside stream
(``qw:task:{Q}:aside:<handler>``, same consumer group), with its record saying why it
waits; members that may run that handler read that stream together with the queue's (one
``XREADGROUP`` over both), members that may not never see it again, and every other job of
the queue runs as before. The last job settled or cancelled off an aside stream deletes it.

Each member looks at the queue's aside set (the handlers with jobs set aside) every
``LOOK_SECONDS``, on the pipeline of its read's membership check (no round trip of its
own), and reads the aside streams of the handlers it may run. What a read of the queue's
stream alone costs does not change; a job costs more only when it is set aside.

Reclaim, attempts and once-only accounting hold as on the queue's stream: at each new
epoch a member claims, on the aside streams it reads, what departed members left (and what
was parked), and its own entries from an earlier life the first time it reads one; the
backstop takes a wedged member's; a leaving member parks what it holds. An aside entry
names its job (``j``) and the starts it had before it was set aside (``a``), so attempts
count on; a settle (``settle_jobs.lua``) writes its record, counted once.

A queue's priority bands (``queueworks.protocol.priorities``) are read the same way, but the
look reads the queue's bands set only when it may have changed: the queue record's bands
version (bumped by each band its jobs first use) changed since the last look, which the
membership check reads with the fields it reads anyway (``seen``); or a job came on a band
this member does not read yet (``stale``: told from the watcher's thread). So an idle look
costs what it did before priorities. Every band in use is a stream this member reads, takes
over, backstops and hands back as it does an aside stream's. ``read`` is in the order a
member reads its streams (``TaskKeys.read_order``: the highest band first).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ResponseError

from queueworks.protocol import events
from queueworks.protocol.jobrecords import ENTRY_STARTS, JobEntry, starts_before
from queueworks.protocol.messages import text
from queueworks.protocol.models import parse_handler_path
from queueworks.protocol.priorities import bands_of
from queueworks.protocol.records import QUEUE_BANDS
from queueworks.transport.connection import UNAVAILABLE

from .loop import Run
from .work import Entries, Gone, Work, in_stream_order

LOOK_SECONDS = 0.25  # a member looks at the aside set this often (with a membership check)

Reply = list[Any]  # an XREADGROUP reply: [[stream, entries], ...]


class Aside:
    """One member's part in its queue's aside streams. ``reads(handler)``: whether this
    member reads a handler's aside stream (it is not outside its ``--allow``)."""

    def __init__(self, run: Run, reads: Callable[[str], bool]) -> None:
        self.run, self.reads = run, reads
        self.main = run.tk.stream
        self.known: frozenset[str] = frozenset()  # the aside set, as last looked at
        self.streams: dict[str, str] = {}  # aside stream -> handler ('': a band), we read
        self.bands: list[int] = []  # the priority bands in use, as last looked at
        self.bands_version: Any = None  # the queue record's bands version, as last seen
        self.bands_due = True  # the next look reads the bands set (any thread sets it)
        self.read: dict[Any, Any] = {self.main: ">"}  # what a read covers, in its order
        self.looked_at = float("-inf")
        self.taken_epoch: int | None = None  # the epoch whose take-over was done
        self.adopted: set[str] = set()  # aside streams whose own old entries we took back
        self.backstop_at = time.monotonic()
        pipe = run.r.pipeline(transaction=False)  # the bands in use before the first read
        pipe.hget(run.tk.record, QUEUE_BANDS)  # (before the set: a band added later bumps it)
        self.look_on(pipe)
        version, *looks = pipe.execute(raise_on_error=False)
        if not isinstance(version, Exception):
            self.bands_version = version
        self.looked(looks, float("-inf"))

    # -- looking ----------------------------------------------------------------------------

    def look_due(self, now: float) -> bool:
        return now - self.looked_at >= LOOK_SECONDS

    def reads_stream(self, stream: str) -> bool:
        """Whether this member reads ``stream`` (an aside stream or a band's) already."""
        return stream in self.streams

    def stale(self) -> None:
        """Look at the aside and bands sets at the next check (any thread: a band this
        member does not read yet was told of a job)."""
        self.bands_due = True
        self.looked_at = float("-inf")

    def seen(self, version: Any) -> bool:
        """The queue record's bands version, as a membership check read it: True if it
        changed (the next look reads the bands set)."""
        if version == self.bands_version:
            return False
        self.bands_version = version
        self.stale()
        return True

    def look_on(self, pipe: Any) -> int:
        """Put the look on ``pipe``: the aside set, and the bands set when it may have
        changed (``bands_due``). Returns how many replies it takes (for ``looked``)."""
        pipe.smembers(self.run.tk.aside)
        if not self.bands_due:
            return 1
        self.bands_due = False  # (one told meanwhile is read by this look: sent later)
        pipe.smembers(self.run.tk.bands)
        return 2

    def looked(self, replies: Sequence[Any], now: float) -> None:
        """The aside set, and the bands set if it was read, as ``look_on`` read them: read
        the streams of the handlers set aside that this member may run, and of the bands
        in use (taken over before the first read of each)."""
        self.looked_at = now
        reply, *read_bands = replies
        if isinstance(reply, Exception) or any(isinstance(b, Exception) for b in read_bands):
            if read_bands:
                self.bands_due = True  # (read them again next time)
            return
        handlers = frozenset(text(h) for h in reply)
        bands = bands_of(read_bands[0]) if read_bands else self.bands
        if handlers == self.known and bands == self.bands:
            return
        self.known, self.bands = handlers, bands
        tk = self.run.tk
        aside = {tk.aside_stream(h): h for h in sorted(handlers) if _path(h) and self.reads(h)}
        order = tk.read_order(bands, aside)
        streams = {stream: aside.get(stream, "") for stream in order if stream != self.main}
        if set(streams) - set(self.streams):
            self.taken_epoch = None  # new streams: take them over before reading them
        self.streams = streams
        self.read = dict.fromkeys(order, ">")

    def is_aside(self, stream: str) -> bool:
        """Whether ``stream`` is an aside stream (not the queue's own or a band's)."""
        return bool(self.streams.get(stream))

    def lost(self, now: float) -> None:
        """A read that covered aside streams failed: one was deleted (emptied) meanwhile.
        Read the queue's stream alone until the next look (not before ``LOOK_SECONDS``:
        a stream that stays missing costs a failed read that often, no more)."""
        self.known, self.streams, self.bands = frozenset(), {}, []
        self.read = {self.main: ">"}
        self.bands_due = True
        self.looked_at = now

    def works(self, reply: Reply) -> list[Work]:
        """The entries of a read (of the queue's stream, or covering aside streams too), as
        ``Work``: an entry with starts before (``a``: an aside entry, a retry that waited)
        runs as the attempt after them."""
        out: list[Work] = []
        for raw_stream, entries in reply:
            out += _works(text(raw_stream), entries)
        return out

    # -- setting a job aside ------------------------------------------------------------------

    def set_aside(self, work: Work, job: JobEntry, refusal: Exception) -> str | int:
        """Move a job read from the queue's stream to its handler's aside stream: the new
        entry's id; 0 if the entry is no longer ours; -1 if it names no waiting job."""
        run = self.run
        why = f"no member may run {job.handler!r}: {refusal}"
        moved = run.scripts.set_aside(
            run.tk,
            work.entry_id,
            job.job_id,
            run.me,
            job.handler,
            why,
            work.attempt - 1,
            work.stream,
        )
        if isinstance(moved, str):  # the controller reads the queue's handlers again
            events.emit(run.r, run.keys, "handlers", task=run.tk.task_id, aside=job.handler)
            run.log.warning(
                "job_set_aside",
                job=job.job_id,
                job_id=job.job_id,
                queue=run.tk.task_id,
                attempt=work.attempt,
                handler=job.handler,
                why=why,
            )
            self.looked_at = float("-inf")
        return moved

    # -- taking over, backstop, hand-back -------------------------------------------------------

    def tick(self) -> None:
        """After the membership's safe point: at a new epoch (or with new streams), take
        over the aside streams we read; now and then, the backstop on them."""
        if not self.streams:
            return
        role = self.run.membership.role
        if role is not None and role.epoch != self.taken_epoch:
            self.taken_epoch = role.epoch
            self._take_over()
        wd = self.run.watchdog
        if time.monotonic() - self.backstop_at > min(self.run.spec.subtask_timeout / 2, 5.0):
            self.backstop_at = time.monotonic()
            idle_ms = int((wd.timeout + wd.grace + self.run.membership.ttl_ms / 1000) * 1000)
            self._each(lambda stream: self.run.reclaim.backstop(stream, idle_ms))

    def _take_over(self) -> None:
        run = self.run
        pipe = run.r.pipeline(transaction=False)
        pipe.zrange(run.tk.members, 0, -1)
        streams = list(self.streams)
        for stream in streams:
            pipe.xinfo_consumers(stream, run.tk.group)
        members, *infos = pipe.execute(raise_on_error=False)
        if isinstance(members, Exception):
            raise members
        live = {text(m) for m in members}
        for stream, info in zip(streams, infos, strict=True):
            if isinstance(info, Exception):
                continue  # deleted meanwhile (emptied): nothing to take over
            consumers = {text(i["name"]): int(i["pending"]) for i in info}
            works: list[Work] = []
            if stream not in self.adopted and consumers.get(run.me):
                works += run.reclaim.adopt_own(stream)
            self.adopted.add(stream)
            claimed, gone = run.reclaim.departed(stream, consumers, live)
            run.ledger.bury_gone(stream, gone)
            self._hold(works + claimed)

    def _each(self, take: Callable[[str], tuple[list[Work], Sequence[Gone]]]) -> None:
        """``take`` on each aside stream we read (one deleted meanwhile is skipped)."""
        for stream in list(self.streams):
            try:
                claimed, gone = take(stream)
            except ResponseError:  # a stream emptied and deleted meanwhile: nothing there
                continue
            self.run.ledger.bury_gone(stream, gone)
            self._hold(claimed)

    def _hold(self, works: list[Work]) -> None:
        if works:
            held = {w.entry_id for w in self.run.held}
            ordered = [w for w in in_stream_order(works) if w.entry_id not in held]
            self.run.held.extendleft(reversed(ordered))
            self.run.log.info("reclaimed", entries=len(ordered), aside=True)

    def hand_back(self) -> None:
        """The run ends: park what we hold on the aside streams (what a cold stop
        interrupted stays ours, to be charged); nothing of it stays in hand."""
        run = self.run
        streams = set(self.streams) | {w.stream for w in run.held if w.stream != self.main}
        try:
            run.ledger.flush()
            for stream in streams:
                with contextlib.suppress(ResponseError):  # deleted meanwhile: nothing held
                    gone = run.reclaim.hand_back(stream, run.ledger.interrupted)
                    run.ledger.bury_gone(stream, gone)
            run.ledger.flush()
        except UNAVAILABLE as exc:  # the leave says so too; what we hold is reclaimed
            run.log.warning("aside_hand_back_failed", error=str(exc))
        run.held = type(run.held)(w for w in run.held if w.stream not in streams)


def _works(stream: str, entries: Entries) -> list[Work]:
    starts = ENTRY_STARTS.encode()  # (one membership test per entry: the read's hot path)
    return [
        Work(stream, eid.decode(), f, 1 if starts not in f else 1 + starts_before(f))
        for eid, f in entries
    ]


def _path(handler: str) -> bool:
    """A handler path a job may name (no other name can be an aside stream's)."""
    try:
        parse_handler_path(handler)
    except ValueError:
        return False
    return True
