"""Which handlers a worker may run: module prefixes, as given with ``--allow``.

``myapp`` allows ``myapp`` and ``myapp.jobs``, not ``myapplication``. Workers check it before
they import anything (``workers.handlers.resolve``); the controller checks it before it
gives a worker a task, from the prefixes each worker publishes in its record.
"""

from __future__ import annotations

from collections.abc import Iterable

from queueworks.protocol.models import parse_handler_path


def allowed(module: str, prefixes: Iterable[str]) -> bool:
    """True if ``module`` is one of ``prefixes`` or inside one."""
    for prefix in prefixes:
        base = prefix.rstrip(".")
        if base and (module == base or module.startswith(base + ".")):
            return True
    return False


def covers(prefixes: Iterable[str], handler: str) -> bool:
    """True if a worker allowing ``prefixes`` may run ``handler`` ("module:function")."""
    try:
        module, _ = parse_handler_path(handler)
    except ValueError:
        return False
    return allowed(module, prefixes)
