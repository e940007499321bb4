"""Every number and name is checked where it enters — the client, the CLI, the dashboard — so
no stored value can crash a worker: finite, in range, or a ``ValueError`` naming the field.

Names (task ids, queue names, the key prefix) match one pattern, ``NAME_PATTERN``: letters,
digits, ``_``, ``.`` and ``-``, the first a letter or digit (so never ``.``, ``..`` or a
name that reads as a flag), anchored at the very end (``\\Z``: ``$`` would let a final
newline through). The bounds below are the ones ``TaskSpec`` and the CLI use too.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"  # a task id or a queue name: 1-64 chars
PREFIX_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}"  # the key prefix: 1-32 chars
WORKER_PATTERN = r"[A-Za-z0-9_.:@-]{1,128}"
_NAME = re.compile(NAME_PATTERN + r"\Z")
_PREFIX = re.compile(PREFIX_PATTERN + r"\Z")
_WORKER = re.compile(WORKER_PATTERN + r"\Z")

MAX_NODES = 1_000_000  # min_nodes / max_nodes of a task or queue
MAX_PRIORITY = 1_000_000_000  # priority: -MAX_PRIORITY .. MAX_PRIORITY (as Kubernetes')
MAX_ATTEMPTS = 1000
MAX_PARTITIONS = 4096
MAX_COUNT = 2**53  # counts Lua compares (max_dead): exact as a double
MAX_TIMEOUT = 7 * 86400.0  # s: subtask_timeout / job_timeout
MAX_TTL = 3650 * 86400.0  # s: result_ttl, a job's delay (ten years)


def _name(value: Any, what: str, pattern: re.Pattern[str], shown: str, rule: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise ValueError(f"{what} {value!r} must match {shown} ({rule})")
    return value


def check_name(value: Any, what: str = "task id") -> str:
    """A task id or queue name (``what`` names it in the error)."""
    rule = "1 to 64 letters, digits, '_', '.' or '-', the first a letter or digit"
    return _name(value, what, _NAME, f"^{NAME_PATTERN}$", rule)


def check_names(values: Iterable[Any], what: str) -> list[str]:
    """A list of names (each as ``check_name`` checks it), each once, in their order."""
    if isinstance(values, str | bytes):
        raise ValueError(f"{what}s must be a list of names, not one string: {values!r}")
    return list(dict.fromkeys(check_name(v, what) for v in values))


def check_prefix(value: Any) -> str:
    rule = "1 to 32 letters, digits, '_', '.' or '-', the first a letter or digit"
    return _name(value, "key prefix", _PREFIX, f"^{PREFIX_PATTERN}$", rule)


def check_worker_id(value: Any) -> str:
    rule = "1 to 128 letters, digits, '_', '.', ':', '@' or '-'"
    return _name(value, "worker id", _WORKER, f"^{WORKER_PATTERN}$", rule)


def check_int(what: str, value: Any, low: int, high: int) -> int:
    """An integer (not a bool, not a float) with ``low <= value <= high``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
    if not low <= number <= high:
        raise ValueError(f"{what} must be between {low} and {high}, got {number}")
    return number


def check_number(
    what: str, value: Any, low: float, high: float, *, above_low: bool = False
) -> float:
    """A finite real number (not a bool) with ``low <= value <= high`` (``low < value``
    if ``above_low``), as a float."""
    number = _real(value)
    if number is None:
        raise ValueError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(number):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if number < low or number > high or (above_low and number == low):
        bound = f"> {low:g}" if above_low else f">= {low:g}"
        raise ValueError(f"{what} must be {bound} and <= {high:g}, got {value!r}")
    return number


def _real(value: Any) -> float | None:
    """A real number (not a bool) as a float (an int too big for one: inf); else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def check_labels(what: str, value: Any) -> dict[str, str]:
    """A selector or labels: a dict of strings to strings."""
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{what} must be a dict of strings to strings, got {value!r}")
    return dict(value)


def check_finite_tree(what: str, value: Any) -> None:
    """No NaN or infinity anywhere in ``value`` (dicts and lists of JSON values): JSON has
    none, and pydantic would store them as null."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{what} must be a finite number, got {value!r}")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_finite_tree(f"{what}.{k}", v)
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_finite_tree(f"{what}[{i}]", v)


def check_resize(min_nodes: Any, max_nodes: Any) -> tuple[int, int | None]:
    """A node set's bounds: ``1 <= min_nodes <= max_nodes`` (None: no upper bound)."""
    low = check_int("min_nodes", min_nodes, 1, MAX_NODES)
    high = None if max_nodes is None else check_int("max_nodes", max_nodes, 1, MAX_NODES)
    if high is not None and high < low:
        raise ValueError(f"max_nodes ({high}) must be >= min_nodes ({low})")
    return low, high


def check_priority(priority: Any) -> int:
    return check_int("priority", priority, -MAX_PRIORITY, MAX_PRIORITY)


def run_at(delay: Any, at: Any, now: float) -> float:
    """When a job given ``delay`` (s from now) or ``at`` (a datetime or Unix time) runs:
    ``delay`` within ``0 .. MAX_TTL``, ``at`` no later than ``now + MAX_TTL``."""
    if delay is not None and at is not None:
        raise ValueError("enqueue: give delay or at, not both")
    if delay is not None:
        return now + check_number("delay", delay, 0.0, MAX_TTL)
    when = _real(at.timestamp() if isinstance(at, datetime) else at)
    if when is None:
        raise ValueError(f"at must be a datetime or a Unix time, got {at!r}")
    if not math.isfinite(when) or when > now + MAX_TTL:
        days = MAX_TTL / 86400
        raise ValueError(f"at must be a finite time at most {days:g} days from now, got {at!r}")
    return when
