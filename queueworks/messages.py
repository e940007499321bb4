"""The hot-path codec: subtask entries and results as JSON, decoded with clear errors.

A stream entry has the fields ``i`` (index), ``p`` (payload JSON) and, in partitioned
tasks, ``k`` (the ordering key). Anything else is a ``BadMessage`` naming what is wrong;
the worker dead-letters it with that reason and keeps working.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any

_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode


class BadMessage(ValueError):
    """A subtask entry that cannot be decoded; the text is the dead-letter reason."""


class NotJSON(ValueError):
    """A payload or result that JSON cannot carry."""


def to_json(value: Any, what: str) -> str:
    try:
        return _dumps(value)
    except (TypeError, ValueError) as exc:
        raise NotJSON(f"{what} is not JSON-serializable: {exc}") from None


@dataclass(slots=True)
class Subtask:
    entry_id: str
    index: int
    payload: Any
    key: str | None
    raw_payload: str


def decode_entry(entry_id: str, fields: dict[bytes, bytes]) -> Subtask:
    """Decode one stream entry; raise ``BadMessage`` for anything malformed."""
    if not fields:
        raise BadMessage("entry has no fields (payload gone: deleted or trimmed)")
    raw_index = fields.get(b"i")
    raw_payload = fields.get(b"p")
    if raw_index is None or raw_payload is None:
        names = sorted(k.decode(errors="replace") for k in fields)
        raise BadMessage(f"entry must have fields 'i' and 'p', has {names}")
    try:
        index = int(raw_index)
    except ValueError:
        raise BadMessage(f"field 'i' is not an integer: {raw_index[:40]!r}") from None
    if index < 0:
        raise BadMessage(f"field 'i' is negative: {index}")
    try:
        text = raw_payload.decode()
        payload = json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadMessage(f"field 'p' is not valid JSON: {exc}") from None
    raw_key = fields.get(b"k")
    key = raw_key.decode(errors="replace") if raw_key is not None else None
    return Subtask(entry_id, index, payload, key, text)


def safe_text(raw: bytes | None, limit: int = 4000) -> str:
    """Bytes from Redis as printable text for a dead letter (never raises)."""
    if raw is None:
        return ""
    return raw[:limit].decode(errors="replace")


def partition_of(key: str, partitions: int) -> int:
    """Stable across processes and runs (unlike ``hash``)."""
    return zlib.crc32(key.encode()) % partitions
