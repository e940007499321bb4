"""The hot-path codec: subtask entries and results as JSON, decoded with clear errors.

A stream entry has the fields ``i`` (index), ``p`` (payload JSON) and, in partitioned
tasks, ``k`` (the ordering key). Anything else is a ``BadMessage`` naming what is wrong;
the worker dead-letters it with that reason and keeps working.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any

from queueworks.errors import NotJSON

SUBTASK_INDEX = "i"
SUBTASK_PAYLOAD = "p"
SUBTASK_KEY = "k"
# the names as the Lua scripts get them (``queueworks.scripts.bound``), and as entries are read
LUA_NAMES = {
    "SUBTASK_INDEX": SUBTASK_INDEX,
    "SUBTASK_PAYLOAD": SUBTASK_PAYLOAD,
    "SUBTASK_KEY": SUBTASK_KEY,
}
_I, _P, _K = (name.encode() for name in (SUBTASK_INDEX, SUBTASK_PAYLOAD, SUBTASK_KEY))

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
# ``_ENCODER.encode`` builds its C encoder anew at every call (a third of its time for a
# small payload): built once here, with the same settings, but no circular-reference
# bookkeeping (a shared table would keep entries an error left): a value that contains
# itself nests without end, a ``RecursionError``, said as too deep (``to_json``).
_C_ENCODE = (
    c_make_encoder(None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False)
    if c_make_encoder is not None
    else None
)


def _dumps(value: Any) -> str:
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    if type(value) is str:
        return encode_basestring(value)
    return "".join(_C_ENCODE(value, 0))


MAX_DEPTH = 100  # the deepest nesting of lists and dicts a payload or result may have
_MARKS = bytes.maketrans(b"{}", b"[]")  # every bracket as "[" or "]": depth is all they tell
_NOT_MARKS = bytes(c for c in range(256) if c not in b'[]{}"')
_STRINGS = re.compile(rb'"[^"]*"')  # once escapes are gone: a string, and brackets in it


def too_deep(raw: str) -> bool:
    """Whether the JSON text ``raw`` nests lists and dicts deeper than ``MAX_DEPTH``. A
    short text costs a length test, one with few brackets two ``count``s; only a text with
    many is read for its nesting, in C: escapes and everything but brackets and quotes
    dropped, then strings, then one pass per level takes the innermost ``[]`` away."""
    if len(raw) <= 2 * MAX_DEPTH or raw.count("[") + raw.count("{") <= MAX_DEPTH:
        return False
    text = raw.replace("\\\\", "").replace('\\"', "").encode()
    marks = text.translate(_MARKS, _NOT_MARKS)
    if b'"' in marks:
        marks = _STRINGS.sub(b"", marks.replace(b'""', b""))
    for _ in range(MAX_DEPTH):
        marks = marks.replace(b"[]", b"")
        if not marks:
            return False
    return True


def _nested(what: str) -> str:
    return f"{what} is nested deeper than {MAX_DEPTH} levels of lists and dicts"


class BadMessage(ValueError):
    """A subtask entry that cannot be decoded; the text is the dead-letter reason."""


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# one decoder for every read: ``json.loads(raw, parse_constant=...)`` builds a new one per
# call, which cost more than decoding a small payload
_loads = json.JSONDecoder(parse_constant=_no_constant).decode


def from_json(raw: str, what: str) -> Any:
    """Strict JSON read from Redis: ``NotJSON`` for invalid JSON, ``NaN``/``Infinity``, and
    nesting deeper than ``MAX_DEPTH`` (whoever wrote it), never else."""
    if too_deep(raw):
        raise NotJSON(f"{what} is not valid JSON: {_nested('it')}")
    try:
        return _loads(raw)
    except (ValueError, RecursionError) as exc:
        raise NotJSON(f"{what} is not valid JSON: {exc}") from None


def to_json(value: Any, what: str) -> str:
    """``value`` as compact JSON; ``NotJSON`` naming ``what`` for what JSON cannot carry,
    for nesting deeper than ``MAX_DEPTH``, and for text UTF-8 cannot carry (a lone
    surrogate: Redis takes bytes)."""
    try:
        raw = _dumps(value)
    except RecursionError:
        raise NotJSON(_nested(what)) from None
    except (TypeError, ValueError) as exc:
        raise NotJSON(f"{what} is not JSON-serializable: {exc}") from None
    if too_deep(raw):
        raise NotJSON(_nested(what))
    if not raw.isascii():  # (a flag read: ASCII text, the common case, costs nothing more)
        try:
            raw.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate ("\\ud800"): no UTF-8 for Redis
            bad = exc.object[exc.start : exc.end]
            raise NotJSON(
                f"{what} is not valid text: it holds a lone surrogate {bad!r}, which UTF-8 "
                "(and so Redis) cannot carry"
            ) from None
    return raw


@dataclass(slots=True)
class Subtask:
    entry_id: str
    index: int
    payload: Any
    key: str | None
    raw_payload: str


def decode_subtask(entry_id: str, fields: dict[bytes, bytes]) -> Subtask:
    """Decode one stream entry; raise ``BadMessage`` for anything malformed."""
    if not fields:
        raise BadMessage("entry has no fields (payload gone: deleted or trimmed)")
    raw_index = fields.get(_I)
    raw_payload = fields.get(_P)
    if raw_index is None or raw_payload is None:
        names = sorted(k.decode(errors="replace") for k in fields)
        raise BadMessage(f"entry must have fields 'i' and 'p', has {names}")
    if not raw_index.isdigit() or len(raw_index) > 18:  # ASCII digits only, as written
        negative = raw_index[:1] == b"-" and raw_index[1:].isdigit()
        what = "negative" if negative else "not a decimal index"
        raise BadMessage(f"field 'i' is {what}: {raw_index[:40]!r}")
    index = int(raw_index)
    try:
        text = raw_payload.decode()
        payload = from_json(text, "field 'p'")
    except UnicodeDecodeError as exc:
        raise BadMessage(f"field 'p' is not valid JSON: {exc}") from None
    except NotJSON as exc:
        raise BadMessage(str(exc)) from None
    raw_key = fields.get(_K)
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


def text(value: object) -> str:
    """A Redis reply (bytes) as text; redis-py's reply types are unions, so accept any."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
