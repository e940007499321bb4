"""The ``queueworks`` command. ``group`` holds the group (``main``, the entry point) with
the commands that start processes (``worker``, ``controller``, ``demo``); every other
command is a module here (``enqueue``, ``submit``, ``info``, ``dead``, ``job``, ``health``,
``schedules``, ``queue_actions``, ``dashboard_server``, ``devserver`` for ``queueworks
redis``, ``autoscale``), with what they share: ``options`` (every option written one way)
and ``failures`` (an expected failure is one line and an exit code). The top layer: it may
import any part of queueworks; only ``group`` imports ``workers/`` and ``controller/``, and
nothing imports this package but ``queueworks.__main__``.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queueworks.cli.group import main

__all__ = ["main"]


def __getattr__(name: str) -> Any:
    """``main``, imported when first used: importing one command's module (say
    ``queueworks.cli.health``) does not import the group and every other command."""
    if name != "main":
        raise AttributeError(f"module 'queueworks.cli' has no attribute {name!r}")
    from queueworks.cli.group import main

    return main
