"""structlog setup: JSON events with fields. Called from entry points only, never at import."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from queueworks.tracing import hooks

_SECRET_URL = re.compile(r"([a-z+]+://[^:/@\s]*:)[^@/\s]+@")


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Mask passwords in any URL that reaches a log line."""
    for k, v in event.items():
        if isinstance(v, str) and "://" in v:
            event[k] = _SECRET_URL.sub(r"\1***@", v)
    return event


def default_format() -> str:
    """``console`` when stderr is a terminal, else ``json`` (a file, a pipe, a collector)."""
    try:
        return "console" if sys.stderr.isatty() else "json"
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return "json"


def configure(level: str = "info", fmt: str | None = None) -> None:
    """Log lines of ``level`` and above to stderr, as ``fmt`` (None: ``default_format``).
    While tracing (``queueworks.tracing``) a line written under a span has its
    ``trace_id`` and ``span_id``."""
    if fmt is None:
        fmt = default_format()
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    traced = [] if hooks.log_fields is None else [hooks.log_fields]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *traced,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            _redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(**fields: Any) -> Any:
    return structlog.get_logger().bind(**fields)


def writes_info(log: Any) -> bool:
    """Whether ``log`` (a bound logger) writes lines of level info (a filtering logger
    below its level: no; any other logger: yes)."""
    enabled = getattr(log, "is_enabled_for", None)
    return True if enabled is None else bool(enabled(logging.INFO))
