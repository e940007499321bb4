"""Resolving handlers: only ``module:function`` under an allowed module prefix.

The path is parsed strictly (no attribute chains, no dunders); the module must be one of
the ``--allow`` prefixes or inside one (``myapp`` allows ``myapp`` and ``myapp.jobs``, not
``myapplication``); the object must be a plain Python function defined under an allowed
prefix too (``from shutil import rmtree`` in ``myapp.jobs`` does not make ``rmtree`` a
handler). A typed job function (``@job``, ``queueworks.job_functions``) is checked as the
function it decorates, and run through its signature: the payload's arguments decoded,
the return value encoded, by their annotations.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from queueworks.job_functions import JobFunctionBase
from queueworks.protocol.allow import allowed
from queueworks.protocol.models import NOT_ALLOWED, UNUSABLE, parse_handler_path


class HandlerRefused(Exception):
    """The handler cannot be used; the message is the reason, ``kind`` says which, and
    ``imported`` whether the path itself is at fault, not this worker: it is no
    ``module:function`` path, or its module imported here and it names no such function,
    not a function, one of a wrong signature."""

    def __init__(self, message: str, kind: str = UNUSABLE, *, imported: bool = False) -> None:
        super().__init__(message)
        self.kind, self.imported = kind, imported


@dataclass(frozen=True)
class Handler:
    path: str
    fn: Callable[..., Any]
    takes_ctx: bool
    on_rebalance: Callable[..., Any] | None


# the handlers found, by path and prefixes: each resolved once a process, not once a queue
# (a worker serving thousands of queues meets one path in each of them)
_found: dict[tuple[str, tuple[str, ...]], Handler] = {}


def resolve(path: str, prefixes: Sequence[str]) -> Handler:
    """The handler at ``path`` if the ``prefixes`` allow it (the module docstring);
    ``HandlerRefused`` saying why not. One found is kept for the process: its module is
    imported and its signature read once. A refusal is not kept (an import that failed may
    succeed later)."""
    key = (path, tuple(prefixes))
    found = _found.get(key)
    if found is None:
        found = _found[key] = _resolve(path, prefixes)
    return found


def _resolve(path: str, prefixes: Sequence[str]) -> Handler:
    try:
        module_name, attr = parse_handler_path(path)
    except ValueError as exc:  # the path's own fault, not this worker's
        raise HandlerRefused(str(exc), imported=True) from None
    if not allowed(module_name, prefixes):
        raise HandlerRefused(
            f"handler {path!r} is outside the allowed module prefixes {list(prefixes)}",
            NOT_ALLOWED,
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise HandlerRefused(
            f"handler {path!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    found = fn = getattr(module, attr, None)
    typed = fn.signature if isinstance(fn, JobFunctionBase) else None
    if typed is not None:
        fn = typed.fn  # checked as the function it decorates
    if fn is None:
        raise HandlerRefused(
            f"handler {path!r}: module {module_name!r} has no {attr!r}", imported=True
        )
    if not inspect.isfunction(fn):
        raise HandlerRefused(f"handler {path!r} is not a plain Python function", imported=True)
    defined_in = getattr(fn, "__module__", None) or "?"
    if not allowed(defined_in, prefixes):  # imported into an allowed module from elsewhere
        raise HandlerRefused(
            f"handler {path!r} is defined in {defined_in!r}, outside the allowed module "
            f"prefixes {list(prefixes)}",
            NOT_ALLOWED,
        )
    if typed is not None:
        hook = getattr(found, "on_rebalance", None)
        run = typed.handler()
        return Handler(path, run, typed.ctx is not None, hook if callable(hook) else None)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not params:
        raise HandlerRefused(
            f"handler {path!r} must take (payload) or (payload, ctx)", imported=True
        )
    hook = getattr(fn, "on_rebalance", None)
    return Handler(path, fn, len(params) >= 2, hook if callable(hook) else None)
