"""Handlers for the CLI tests (``--allow tests.handlers_cli``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def needs_file(payload: dict[str, Any]) -> int:
    """Fails until the file ``payload["file"]`` exists, then doubles ``payload["x"]``: a
    subtask that dies, and runs once it is requeued after the cause is fixed."""
    path = Path(payload["file"])
    if not path.exists():
        raise FileNotFoundError(f"needs_file: {path} does not exist yet")
    return 2 * int(payload["x"])
