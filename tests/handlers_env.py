"""A handler module that cannot be imported where ``QW_TEST_BROKEN_IMPORT=1`` is set: a
worker whose --allow covers it, yet which cannot run it (a missing dependency, say)."""

from __future__ import annotations

import os
import time
from typing import Any

if os.environ.get("QW_TEST_BROKEN_IMPORT") == "1":
    raise ImportError("this worker lacks what tests.handlers_env needs")


def triple(payload: dict[str, Any]) -> int:
    time.sleep(float(payload.get("seconds", 0)))
    return int(payload["x"]) * 3
