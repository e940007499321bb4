"""A job's own options, given on enqueue: its retry schedule (``retry_delay``,
``retry_backoff``, ``retry_max_delay``: the queue's settings of the same names, for this job
alone) its uniqueness (``key``, ``unique_for``) and its ``group`` (at most the queue's
``group_limit`` jobs of one group run at once: ``queueworks.workers.groups``).

A job that has any carries them as one compact JSON object, in its stream entry's ``o``
field and, while it waits off the stream (delayed, deferred, a retry waiting for its time),
in its record's ``o`` field; a job without any has no ``o`` at all, so the plain enqueue
stays one bare ``XADD`` of three fields. ``JobOptions.parse`` reads it back: a worker
parses a job's once, as it decodes its entry (``queueworks.protocol.jobrecords``:
``JobEntry.job_options``), and reads that from then on.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, fields
from typing import Any

from queueworks.protocol.validate import MAX_TIMEOUT, MAX_TTL, check_number

GROUP_FIELD = "group"  # the name of a job's group in its ``o`` JSON (Lua reads it there)
MAX_KEY = 256  # bytes of a unique key (UTF-8)
MAX_BACKOFF = 100.0  # the largest retry_backoff factor
MAX_RETRY_DELAY = MAX_TIMEOUT  # s: retry_delay and retry_max_delay


def check_retry_delay(what: str, value: Any) -> float:
    return check_number(what, value, 0.0, MAX_RETRY_DELAY)


def check_retry_backoff(value: Any) -> float:
    return check_number("retry_backoff", value, 1.0, MAX_BACKOFF)


CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # Unicode's control characters (category Cc)


def check_key(value: Any, what: str = "key") -> str:
    """A unique key (or a group's name: ``what``): a non-empty string of at most
    ``MAX_KEY`` bytes of UTF-8, no control character (C0, DEL or C1: ``CONTROL``)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValueError(f"{what} {value!r} holds a lone surrogate (no UTF-8 text)") from None
    if size > MAX_KEY:
        raise ValueError(f"{what} is too long: {size} bytes (at most {MAX_KEY})")
    if CONTROL.search(value):
        raise ValueError(f"{what} {value!r} holds a control character")
    return value


def check_group(value: Any) -> str:
    """A job's group: as a unique key is checked."""
    return check_key(value, "group")


@dataclass(frozen=True)
class JobOptions:
    """A job's own options; None: as its queue has it (or not unique)."""

    retry_delay: float | None = None
    retry_backoff: float | None = None
    retry_max_delay: float | None = None
    key: str | None = None
    unique_for: float | None = None
    group: str | None = None

    @classmethod
    def given(
        cls,
        *,
        retry_delay: Any = None,
        retry_backoff: Any = None,
        retry_max_delay: Any = None,
        key: Any = None,
        unique_for: Any = None,
        group: Any = None,
    ) -> JobOptions | None:
        """The options an enqueue was given, checked (``ValueError`` naming the bad one);
        None if it was given none (at once: the plain enqueue's path)."""
        if (
            retry_delay is None
            and retry_backoff is None
            and retry_max_delay is None
            and key is None
            and unique_for is None
            and group is None
        ):
            return None
        if unique_for is not None and key is None:
            raise ValueError("unique_for needs a key: enqueue(..., key=..., unique_for=...)")
        options = cls(
            None if retry_delay is None else check_retry_delay("retry_delay", retry_delay),
            None if retry_backoff is None else check_retry_backoff(retry_backoff),
            None
            if retry_max_delay is None
            else check_retry_delay("retry_max_delay", retry_max_delay),
            None if key is None else check_key(key),
            None
            if unique_for is None
            else check_number("unique_for", unique_for, 0.0, MAX_TTL, above_low=True),
            None if group is None else check_group(group),
        )
        return options if options != NO_OPTIONS else None

    def given_only(self) -> dict[str, Any]:
        """The options given (set), by name."""
        return {
            f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None
        }

    def json(self) -> str:
        """The ``o`` field: the options given, compact ('' for none)."""
        given = self.given_only()
        return json.dumps(given, separators=(",", ":")) if given else ""

    @classmethod
    def parse(cls, raw: str | bytes | None) -> JobOptions:
        """An ``o`` field read back; a value that is not what ``json`` writes (written by
        hand, or by another version) counts as none of the options it holds badly."""
        if not raw:
            return NO_OPTIONS
        if isinstance(raw, str):
            if not any(name in raw for name in _NAMES):
                return NO_OPTIONS  # none of ours (a traced job's context: queueworks.tracing)
        elif not any(name in raw for name in _BNAMES):
            return NO_OPTIONS
        try:
            found = json.loads(raw)
        except ValueError:
            return NO_OPTIONS
        if not isinstance(found, dict):
            return NO_OPTIONS
        kept: dict[str, Any] = {}
        for f in fields(cls):
            value: Any = found.get(f.name)
            if f.name == "group":
                with contextlib.suppress(ValueError):
                    kept[f.name] = check_group(value)
            elif f.name == "key":
                if isinstance(value, str) and value:
                    kept[f.name] = value
            elif _number(value):
                kept[f.name] = float(value)
        return cls(**kept) if kept else NO_OPTIONS


NO_OPTIONS = JobOptions()  # of a job that has none of its own (a plain job: no 'o')
_NAMES = tuple(f'"{f.name}"' for f in fields(JobOptions))  # what ``json`` may write
_BNAMES = tuple(n.encode() for n in _NAMES)


def _number(value: Any) -> bool:
    """A number an option may be: finite, in ``0 .. MAX_TTL``."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and value == value and 0 <= value <= MAX_TTL  # NaN is not itself
