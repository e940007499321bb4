"""The ``queueworks`` command. ``group`` holds the group (``main``, the entry point) with
the commands that start processes (``worker``, ``controller``, ``demo``); every other
command is a module here (``enqueue``, ``submit``, ``info``, ``dead``, ``job``, ``health``,
``schedules``, ``queue_actions``, ``dashboard_server``, ``devserver`` for ``queueworks
redis``, ``autoscale``), with what they share: ``options`` (every option written one way)
and ``failures`` (an expected failure is one line and an exit code). The top layer: it may
import any part of queueworks; only ``group`` imports ``workers/`` and ``controller/``, and
nothing imports this package but ``queueworks.__main__``.
"""

from queueworks.cli.group import main

__all__ = ["main"]
