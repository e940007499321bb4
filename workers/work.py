"""What a member holds: ``Work`` (one stream entry in hand), and the words every part of the
runtime shares about it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from queueworks.protocol.messages import BadMessage, decode_subtask

Fields = dict[bytes, bytes]
Entries = list[tuple[bytes, Fields]]  # (entry id, fields) as XREADGROUP returns them
Batches = list[tuple[str, Entries]]  # entries read, by stream
Gone = tuple[str, int]  # (entry id, deliveries) of a pending entry whose payload was deleted


@dataclass(slots=True)
class Work:
    stream: str
    entry_id: str
    fields: Fields
    attempt: int  # deliveries so far; the attempt it runs as, once ``charge`` is spent
    charge: bool = False  # may have run before: spend an attempt (XCLAIM) before it starts
    recheck: bool = False  # its step's end may still settle it: look that it is pending first

    @property
    def index(self) -> int | None:
        """The subtask index it names, or None if it does not decode."""
        try:
            return decode_subtask(self.entry_id, self.fields).index
        except BadMessage:
            return None


class Leave(Exception):
    """Stop working on this task (revoked, finished, stopping); the text says why."""


def in_stream_order(works: Iterable[Work]) -> list[Work]:
    """``works`` sorted by entry id, each entry once."""
    seen: set[str] = set()
    out = []
    for w in sorted(works, key=lambda w: _id_key(w.entry_id)):
        if w.entry_id not in seen:
            seen.add(w.entry_id)
            out.append(w)
    return out


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
