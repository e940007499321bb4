"""Handlers for the poison, fuzz and security tests (``--allow tests.handlers_poison``).

``mixed`` runs one task whose subtasks are mostly good and a few poisonous: ``{"x": i}``
doubles, ``{"exit": true}`` kills its own process, ``{"hang": true}`` never returns (looping
in Python), ``{"hang_in_c": true}`` blocks in C for ever, ``{"result": kind}`` returns a
value JSON cannot carry.
"""

from __future__ import annotations

import math
import os
import threading
import time
from json import dumps as reexported  # noqa: F401 - defined in a module nobody allowed
from typing import Any

from queueworks.context import SubtaskContext

NOT_JSON: dict[str, Any] = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "bytes": b"\x00\x01",
    "set": {1, 2},
    "nested_nan": {"a": [1, {"b": math.nan}]},
    "object": object(),
}


def mixed(payload: dict[str, Any], ctx: SubtaskContext) -> dict[str, Any]:
    if payload.get("exit"):
        os._exit(3)
    if payload.get("hang"):
        while True:  # Python code: the watchdog's exception lands when a sleep returns
            time.sleep(0.5)
    if payload.get("hang_in_c"):
        threading.Event().wait()  # blocked in C for ever: only a process exit ends it
    if "result" in payload:
        return {"value": NOT_JSON[payload["result"]]}
    return {"y": int(payload["x"]) * 2, "attempt": ctx.attempt, "worker": ctx.worker_id}


class NotAFunction:
    """A class: callable, but not a handler."""

    def __init__(self, payload: Any) -> None:
        self.payload = payload


not_a_function = NotAFunction
a_builtin = len  # a builtin function object: callable, not a plain Python function
a_module = os  # a module attribute
a_lambda = lambda payload: payload  # noqa: E731 - a plain function, so it is allowed
