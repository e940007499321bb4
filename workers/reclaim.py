"""Taking over pending entries, and handing them back.

Three ways to take entries over, each its own small function over ``reclaim.lua`` (claims
spend no attempt: JUSTID; what may have run before is charged when it starts again,
``Ledger.start``):

* ``departed``: every entry of a consumer that is no longer a member, at once (no idle
  wait), and every parked entry (handed back by a graceful leave: those never ran).
* ``adopt_own``: our own pending entries from an earlier life of this worker (a lost
  connection, a Redis restart that lost acks, a restart under the same name).
* ``backstop``: any entry idle past the watchdog's hard limit plus a TTL — its holder is
  still a member but should have exited long ago (wedged).

``hand_back`` parks what we hold (a graceful leave, partitions we no longer own). Entries
whose payload was deleted while pending are reported as ``Gone`` for the ledger to settle.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from redis.exceptions import ResponseError

from queueworks.protocol.jobrecords import starts_before
from queueworks.protocol.keys import PARKED, TaskKeys
from queueworks.protocol.messages import text
from queueworks.queue.vanished import stream_gone
from queueworks.scripts.bound import Claimed, Scripts
from queueworks.transport.connection import Connection

from .work import Gone, Work

RECLAIM_BATCH = 500  # XPENDING/XCLAIM batch: large batches stall the server

Taken = tuple[list[Work], list[Gone]]
Consumers = dict[str, int]  # a group's consumers of one stream -> entries pending on each


class Reclaim:
    def __init__(self, r: Connection, scripts: Scripts, tk: TaskKeys, worker_id: str) -> None:
        self.r, self.scripts, self.tk, self.me = r, scripts, tk, worker_id

    def consumers(self, stream: str) -> Consumers:
        """The group's consumers of ``stream`` and how many entries each has pending (none
        if the stream or its group is gone)."""
        try:
            return _consumers(self.r.xinfo_consumers(stream, self.tk.group))
        except ResponseError as exc:
            if not stream_gone(exc):
                raise
            return {}

    def consumers_on(
        self, pipe: Any, streams: Sequence[str], into: dict[str, Consumers]
    ) -> Callable[[list[Any]], None]:
        """``consumers`` of each of ``streams``, read on ``pipe`` (executed with
        ``raise_on_error=False``): returns what puts them ``into`` the dict from its
        replies (an error reply is raised)."""
        at = len(pipe)
        for stream in streams:
            pipe.xinfo_consumers(stream, self.tk.group)

        def read(replies: list[Any]) -> None:
            for k, stream in enumerate(streams):
                reply = replies[at + k]
                if isinstance(reply, Exception):
                    if not stream_gone(reply):
                        raise reply
                    reply = []
                into[stream] = _consumers(reply)

        return read

    def departed(self, stream: str, consumers: dict[str, int], members: Collection[str]) -> Taken:
        """Everything pending on consumers that are not ``members`` (charged when they
        start), and everything parked (never ran: not charged). ``members`` only narrows
        whom to try: the script checks membership itself, atomically."""
        works: list[Work] = []
        gone: list[Gone] = []
        for name in consumers:
            if name == self.me or name in members:
                continue
            parked = name == PARKED
            while True:
                claimed, lost = self.scripts.reclaim(
                    self.tk,
                    stream,
                    self.me,
                    from_consumer=name,
                    hand_back=True,
                    only_departed=not parked,
                )
                works += _works(stream, claimed, charge=not parked)
                gone += lost
                if not claimed or len(claimed) + len(lost) < RECLAIM_BATCH:
                    break
        return works, gone

    def adopt_own(self, stream: str) -> list[Work]:
        """Entries still pending on our own consumer (read, never settled): charged. None
        if the stream or its group is gone."""
        out: list[Work] = []
        start = "-"
        while True:
            try:
                pending: Any = self.r.xpending_range(
                    stream, self.tk.group, start, "+", RECLAIM_BATCH, consumername=self.me
                )
            except ResponseError as exc:
                if not stream_gone(exc):
                    raise
                return out
            if not pending:
                return out
            pipe = self.r.pipeline(transaction=False)
            for p in pending:
                pipe.xrange(stream, p["message_id"], p["message_id"])
            for p, entry in zip(pending, pipe.execute(), strict=True):
                fields = entry[0][1] if entry else {}
                delivered = int(p["times_delivered"]) + starts_before(fields)
                out.append(Work(stream, text(p["message_id"]), fields, delivered, True))
            if len(pending) < RECLAIM_BATCH:
                return out
            start = "(" + text(pending[-1]["message_id"])

    def backstop(self, stream: str, idle_ms: int) -> Taken:
        """Entries idle for ``idle_ms`` or more, whoever holds them: charged."""
        claimed, gone = self.scripts.reclaim(
            self.tk, stream, self.me, min_idle_ms=idle_ms, hand_back=True, only_departed=False
        )
        return _works(stream, claimed, charge=True), gone

    def hand_back(self, stream: str, keep: Collection[str] = ()) -> list[Gone]:
        """Park every entry we still hold in ``stream`` (JUSTID: no attempt spent), but those
        in ``keep`` (the ones a cold stop interrupted: they started, so whoever takes them
        from us charges them). Only entries still ours move: nothing a reclaimer took is
        stolen back."""
        gone: list[Gone] = []
        while True:
            claimed, lost = self.scripts.reclaim(
                self.tk,
                stream,
                PARKED,
                from_consumer=self.me,
                hand_back=True,
                only_departed=False,
                keep=keep,
            )
            gone += lost
            if not claimed or len(claimed) + len(lost) < RECLAIM_BATCH:
                return gone

    def parked_one(self, stream: str) -> tuple[Work | None, list[Gone]]:
        """One parked entry, if any (lockstep mode takes one shard per member and step)."""
        claimed, gone = self.scripts.reclaim(
            self.tk,
            stream,
            self.me,
            from_consumer=PARKED,
            count=1,
            hand_back=True,
            only_departed=False,
        )
        works = _works(stream, claimed, charge=False)
        return (works[0] if works else None), gone


def _consumers(infos: Any) -> Consumers:
    return {text(i["name"]): int(i["pending"]) for i in infos}


def _works(stream: str, claimed: list[Claimed], *, charge: bool) -> list[Work]:
    """Claimed entries as ``Work``: an attempt per delivery, after the starts a job set
    aside had before (``starts_before``)."""
    return [
        Work(stream, c.entry_id, c.fields, c.deliveries + starts_before(c.fields), charge)
        for c in claimed
    ]
