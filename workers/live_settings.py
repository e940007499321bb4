"""A queue's live settings on one member (``Queue.configure``: ``queueworks.queue.configure``).

The queue's record keeps a settings version that each configure bumps. The member reads it
with the membership check it already makes (no command of its own: one field more on a read
it sends anyway) and says what it saw (``seen``); when the version changed, it reads the
queue's spec again (``changed``: one command, only then), and the queue loop starts the jobs
of that read, and all after, with it. A job running meanwhile keeps the settings it started
with: each call takes its timeout when it starts.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from queueworks.protocol.models import StoredSpec

from .loop import Run


class LiveSettings:
    """The settings version a member has applied, and the one its last check saw."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.applied: Any = None  # the version the member's spec is of (None: as opened)
        self.latest: Any = None  # the version the last check read

    def seen(self, version: Any) -> None:
        """The queue record's settings version, as a check read it (None: never changed)."""
        self.latest = version

    def changed(self) -> StoredSpec | None:
        """The queue's spec, read again, if its settings changed since the member applied
        them; None if not (or it cannot be read: the member goes on as it is)."""
        if self.latest == self.applied:
            return None
        run, latest = self.run, self.latest
        raw = run.r.hget(run.tk.record, "spec")
        self.applied = latest
        if raw is None:
            return None
        try:
            spec = StoredSpec.model_validate_json(raw)
        except ValidationError as exc:
            run.log.warning("queue_settings_unreadable", error=str(exc))
            return None
        run.log.info("queue_settings_changed", version=str(latest))
        return spec
