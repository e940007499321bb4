"""The ledger of one member in one task: attempts, dead letters and settling.

Outcomes are recorded as they happen (``succeeded`` on the hot path, ``bury``, ``failed``)
and settled in batches by ``flush``: one atomic Lua step per stream (``settle.lua``: ack,
results written once, dead letters, counts by index). An attempt is a start: an entry that
may have run before is charged (``XCLAIM``: delivery count + 1) in ``start``, just before it
runs again, after everything done so far is settled.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from typing import Any

from queueworks.protocol import events
from queueworks.protocol.keys import Keys, TaskKeys
from queueworks.protocol.messages import SUBTASK_PAYLOAD, safe_text
from queueworks.protocol.models import StoredSpec
from queueworks.scripts.bound import DeadEntry, Scripts, Settled
from queueworks.task.dependencies import plan_drain
from queueworks.transport.connection import Connection
from queueworks.transport.runner import run

from .heartbeat import Seat
from .work import Gone, Work

Succeeded = list[tuple[str, int, str]]  # (entry id, index, result JSON) of one stream


def failed_reason(attempts: int) -> str:
    """Why an item that failed every attempt died: "failed 1 time", "failed 3 times"."""
    return f"failed {attempts} time{'' if attempts == 1 else 's'}"


class Attempts:
    """What every ledger shares: an attempt is a start, charged in Redis."""

    def __init__(
        self,
        r: Connection,
        scripts: Scripts,
        tk: TaskKeys,
        keys: Keys,
        spec: StoredSpec,
        state: Seat,
        log: Any,
    ) -> None:
        self.r, self.scripts, self.tk, self.keys, self.spec = r, scripts, tk, keys, spec
        self.state, self.log = state, log
        self.me = state.worker_id
        self.last_flush = time.monotonic()
        self.ended = False  # a settle found the task finished: the member should leave
        self.interrupted: set[str] = set()  # entries a cold stop interrupted: they started
        # The loop leaves at its next safe point once ``ended``: the event of the task's end
        # (a settle of ours finished it) rides with the leave (``announce``), not alone.
        self.hold_end = False
        self.unannounced = ""  # that event's kind, held back until ``announce``

    def announce(self, pipe: Any) -> None:
        """Put the held-back event of the task's end (``hold_end``) on ``pipe``, once."""
        if self.unannounced:
            events.emit(pipe, self.keys, self.unannounced, task=self.tk.task_id)
            self.unannounced = ""

    def flush(self) -> None:
        """Settle everything recorded so far."""
        raise NotImplementedError

    def exhausted(self, work: Work, why: str) -> None:
        """``work`` may not start again: it ran out of attempts."""
        raise NotImplementedError

    def bury_gone(self, stream: str, gone: Sequence[Gone]) -> None:
        """Pending entries whose payload was deleted or trimmed: settle them."""
        raise NotImplementedError

    def sweep_lost(self, streams: Sequence[str]) -> None:
        """The leader, idle: account for what was deleted before it settled (if anything
        can be: a task's indices can)."""

    def start(self, work: Work) -> Work | None:
        """The entry as it may run now, or None (dead-lettered, or no longer ours).

        An entry that may have run before (reclaimed, adopted) is charged here, when it
        starts, not when it was claimed: a worker that dies charges only the entry it was
        running, never the ones it merely held. Everything done is settled first, so if
        this entry kills the process, nothing else runs again."""
        if work.charge:
            work = Work(work.stream, work.entry_id, work.fields, work.attempt + 1)
            if work.attempt <= self.spec.max_attempts:
                self.flush()
                if not self.r.xclaim(work.stream, self.tk.group, self.me, 0, [work.entry_id]):
                    return None  # settled meanwhile (a slow runner finished it)
        if work.attempt > self.spec.max_attempts:
            starts = work.attempt - 1
            why = (
                f"started {starts} times without finishing (max_attempts="
                f"{self.spec.max_attempts}): each time its worker died, or its handler "
                "overran its time limit (the timeout and then the grace after it) and hung"
            )
            self.exhausted(Work(work.stream, work.entry_id, work.fields, starts), why)
            return None
        return work

    def retry(self, work: Work) -> Work | None:
        """Spend an attempt of ``work`` (XCLAIM to ourselves raises the delivery count: in
        Redis too) and return it as the next attempt; None if it is no longer ours."""
        if not self.r.xclaim(work.stream, self.tk.group, self.me, 0, [work.entry_id]):
            return None  # reclaimed by the others meanwhile
        return Work(work.stream, work.entry_id, work.fields, work.attempt + 1)


class Ledger(Attempts):
    """The subtasks' ledger: outcomes by index, settled by ``settle.lua``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ok: dict[str, Succeeded] = {}
        self.dead: dict[str, list[DeadEntry]] = {}

    def exhausted(self, work: Work, why: str) -> None:
        self.bury(work, work.index, "exceeded max_attempts", why)

    def succeeded(self, stream: str) -> Succeeded:
        """The list to append ``(entry id, index, result JSON)`` of ``stream`` to (the hot
        path appends to it directly; ``flush`` settles it)."""
        return self.ok.setdefault(stream, [])

    def failed(self, work: Work, index: int, exc: BaseException, payload: str) -> Work | None:
        """A handler raised: dead-letter it after ``max_attempts``, else spend an attempt
        and return the retry (to run before anything later in its stream)."""
        tb = "".join(traceback.format_exception(exc))
        if work.attempt >= self.spec.max_attempts:
            self.bury(work, index, failed_reason(work.attempt), tb, payload)
            return None
        self.log.info("subtask_retry", index=index, attempt=work.attempt, error=repr(exc))
        return self.retry(work)

    def bury(
        self, work: Work, index: int | None, reason: str, error: str, payload: str | None = None
    ) -> None:
        """Dead-letter ``work`` at the next flush (rejected there if it is no subtask)."""
        if payload is None:
            payload = safe_text(work.fields.get(SUBTASK_PAYLOAD.encode()))
        entry = DeadEntry(work.entry_id, index, reason, error[-8000:], work.attempt, payload)
        self.dead.setdefault(work.stream, []).append(entry)
        self.log.warning("dead_lettered", index=index, reason=reason, attempts=work.attempt)

    def bury_gone(self, stream: str, gone: Sequence[Gone]) -> None:
        """Pending entries whose payload was deleted or trimmed: settle them (as rejected:
        their index is unknown; ``sweep_lost`` later dead-letters the index they held)."""
        for entry_id, deliveries in gone:
            self.bury(
                Work(stream, entry_id, {}, deliveries),
                None,
                "payload gone",
                "entry deleted or trimmed while pending",
            )

    def pending(self) -> bool:
        """Outcomes recorded and not settled yet."""
        return any(self.ok.values()) or any(self.dead.values())

    def note(self, stream: str, settled: Settled) -> str:
        """What a settle of ``stream`` found (a ``flush``'s, or one the loop sent itself):
        the task ended, entries were rejected; the state it finished the task in, if so
        (then ``finish`` it)."""
        self.ended = self.ended or not settled.active
        if settled.rejected:
            self.log.warning("entries_rejected", stream=stream, count=settled.rejected)
        return settled.state

    def finish(self, state: str) -> None:
        """Our settle finished the task in ``state``."""
        if state:
            self._finished(state)

    def flush(self) -> None:
        """Settle everything recorded: one atomic step per stream (ack, results, dead
        letters, counts), and the events that follow from it."""
        self.last_flush = time.monotonic()
        settled_n = sum(map(len, self.ok.values())) + sum(map(len, self.dead.values()))
        if not settled_n:
            return
        now = time.time()
        finished = ""  # the state a settle of ours finished the task in
        self.state.processed += settled_n
        for stream in {*self.ok, *self.dead}:
            if not self.ok.get(stream) and not self.dead.get(stream):
                continue
            settled = self.scripts.settle(
                self.tk, stream, self.me, now, self.ok.get(stream, ()), self.dead.get(stream, ())
            )
            finished = finished or self.note(stream, settled)
        buried = [d for entries in self.dead.values() for d in entries]
        self.ok.clear()
        self.dead.clear()
        if buried:
            first = buried[0]
            which = {"index": first.index} if first.index is not None else {"entry": first.entry_id}
            events.dead_lettered(
                self.r, self.keys, self.tk.task_id, len(buried), first.reason, **which
            )
        if finished:
            self._finished(finished)

    def sweep_lost(self, streams: Sequence[str]) -> None:
        """If nothing of the task is in flight, dead-letter the indices no entry is left
        for (deleted from the stream), so the task can complete by index."""
        lost = self.scripts.sweep_lost(self.tk, streams, self.me, time.time())
        if lost:
            self.log.warning("subtasks_lost", count=lost, reason="stream entries deleted")
            events.dead_lettered(self.r, self.keys, self.tk.task_id, lost, "lost")
            settled = self.scripts.settle(self.tk, streams[0], self.me, time.time(), [])
            if settled.finished:
                self._finished(settled.state)

    def _finished(self, state: str) -> None:
        """This member's settle finished the task in ``state`` (the settle's reply says
        which): say how it ended."""
        self.ended = True
        self.log.info("task_finished", state=state)
        run(self.r, self.scripts, plan_drain(self.keys, [self.tk.task_id]))  # its dependents
        if self.hold_end:
            self.unannounced = state
        else:
            events.emit(self.r, self.keys, state, task=self.tk.task_id)
