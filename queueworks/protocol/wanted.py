"""Wanted workers: how many workers the controller says each node selector needs now.

The leading controller writes it (``controller.demand``) to ``qw:autoscale:wanted`` as
JSON, fenced, with an expiry: a value nobody refreshes goes away, so a reader never acts on
the word of a controller that stopped. The dashboard (``/metrics``, ``/api/autoscale``),
``queueworks info`` and ``queueworks autoscale`` read it through this module, its one codec.

A selector is named by its labels, sorted, as ``k=v,k2=v2``; the empty name is the work that
names no selector (any worker may do it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from queueworks.protocol.keys import Keys

LABEL = re.compile(r"^[^=,\s]+$")  # a label's key or value: no '=', ',' or whitespace


class Wanted(BaseModel):
    """The published value: per selector name, the workers wanted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    at: float = Field(ge=0)  # Unix time of the computation
    by: str  # the controller that wrote it
    target_s: float = Field(gt=0)  # the drain target it was computed for
    selectors: dict[str, int]

    def of(self, selector: str) -> int:
        """Workers wanted for the selector named ``selector`` (0 when none is)."""
        return self.selectors.get(selector, 0)


def selector_name(selector: Mapping[str, str]) -> str:
    """``{"b": "2", "a": "1"}`` -> ``"a=1,b=2"``; ``{}`` -> ``""``."""
    return ",".join(f"{k}={selector[k]}" for k in sorted(selector))


def parse_selector(items: Iterable[str]) -> str:
    """The selector name of ``k=v`` items (``--selector`` given once or more, each may hold
    several, comma-separated); ``ValueError`` naming a bad one."""
    labels: dict[str, str] = {}
    for item in items:
        for part in item.split(","):
            if not part.strip():
                continue
            key, eq, value = part.strip().partition("=")
            if not eq or not LABEL.match(key) or not LABEL.match(value):
                raise ValueError(f"selector: {part!r} is not k=v (no ',', '=' or spaces)")
            if labels.get(key, value) != value:
                raise ValueError(f"selector: {key!r} given twice with different values")
            labels[key] = value
    return selector_name(labels)


def encode(wanted: Wanted) -> str:
    return wanted.model_dump_json()


def decode(raw: Any) -> Wanted | None:
    """The stored value, or None when there is none or it does not decode."""
    if raw is None:
        return None
    try:
        return Wanted.model_validate_json(raw)
    except (ValidationError, ValueError):
        return None


def read(r: Any, keys: Keys) -> Wanted | None:
    """The wanted workers the leading controller published (None: none is published)."""
    return decode(r.get(keys.wanted))
