"""structlog setup: JSON events with fields. Called from entry points only, never at import."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

_SECRET_URL = re.compile(r"([a-z+]+://[^:/@\s]*:)[^@/\s]+@")


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Mask passwords in any URL that reaches a log line."""
    for k, v in event.items():
        if isinstance(v, str) and "://" in v:
            event[k] = _SECRET_URL.sub(r"\1***@", v)
    return event


def configure(level: str = "info", fmt: str = "json") -> None:
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
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
