"""A typed job's arguments by parameter name, for its page (``job_functions.arguments_of``).

A payload sent by name (as a Python producer sends it) names its own arguments; one sent
by position (``{"args": [4, 5]}``, as a producer in another language may) is named by the
handler's signature, read from the job function itself. The dashboard imports a handler's
module only under the module prefixes it was started with (``queueworks dashboard
--allow``), as a worker does (``queueworks.protocol.allow``); outside them, or when the import
fails, the arguments are shown by position (``#0``, ``#1``...).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from functools import lru_cache

from queueworks.job_functions import JobFunctionBase, arguments_of
from queueworks.logs import get_logger
from queueworks.protocol.allow import allowed
from queueworks.protocol.models import parse_handler_path


def job_arguments(
    payload: str | None, handler: str, prefixes: Sequence[str]
) -> list[tuple[str, str]] | None:
    """``(name, JSON)`` for each argument of a typed job's payload; None for any other."""
    shown = arguments_of(payload)
    if shown is None or not any(name.startswith("#") for name, _ in shown):
        return shown
    return arguments_of(payload, positional_names(handler, tuple(prefixes)))


@lru_cache(maxsize=256)
def positional_names(handler: str, prefixes: tuple[str, ...]) -> tuple[str, ...]:
    """The names a typed job function's arguments given by position take, in order; ()
    when its module is outside ``prefixes``, cannot be imported, or it is no ``@job``."""
    try:
        module_name, attr = parse_handler_path(handler)
    except ValueError:
        return ()
    if not allowed(module_name, prefixes):
        return ()
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # its import's own error: shown by position
        get_logger(component="dashboard").warning(
            "handler_not_imported", handler=handler, error=f"{type(exc).__name__}: {exc}"
        )
        return ()
    fn = getattr(module, attr, None)
    if not isinstance(fn, JobFunctionBase):
        return ()
    if not allowed(getattr(fn.signature.fn, "__module__", "") or "", prefixes):
        return ()  # imported into an allowed module from elsewhere
    return tuple(fn.signature.positional)
