"""Which queues a worker serves: every active queue whose node selector its labels match,
whose jobs' handlers its ``--allow`` prefixes cover (one of them is enough; a queue whose
jobs name none yet, any), and, when it was started with ``--queues``, one of those.

The scout reads the queue names (``qw:queues``) and each queue's state, spec and handlers in
one pipeline; a spec never changes, so it is parsed once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from queueworks.allow import covers
from queueworks.connection import Connection, text
from queueworks.keys import Keys
from queueworks.models import ACTIVE_STATES, StoredSpec

ACTIVE = frozenset(s.value for s in ACTIVE_STATES)


def may_serve(
    spec: StoredSpec,
    handlers: Collection[str],
    *,
    labels: Mapping[str, str],
    allow: Sequence[str],
) -> bool:
    """True if a worker with ``labels`` and ``allow`` prefixes may serve the queue."""
    if any(labels.get(k) != v for k, v in spec.node_selector.items()):
        return False
    return not handlers or any(covers(allow, h) for h in handlers)


class Scout:
    def __init__(
        self,
        r: Connection,
        keys: Keys,
        *,
        labels: Mapping[str, str],
        allow: Sequence[str],
        only: Collection[str] | None = None,
    ) -> None:
        self.r, self.keys = r, keys
        self.labels, self.allow = dict(labels), list(allow)
        self.only = frozenset(only) if only else None  # --queues
        self.specs: dict[str, StoredSpec | None] = {}  # parsed once (None: not a queue)

    def eligible(self) -> list[str]:
        """The queues this worker may serve now, by name."""
        names = sorted(text(n) for n in self.r.smembers(self.keys.queues))
        if self.only is not None:
            names = [n for n in names if n in self.only]
        if not names:
            return []
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            tk = self.keys.task(name)
            pipe.hmget(tk.record, ["state", "spec"])
            pipe.smembers(tk.handlers)
        replies = pipe.execute()
        out = []
        for k, name in enumerate(names):
            (state, raw), handlers = replies[2 * k], replies[2 * k + 1]
            if text(state) not in ACTIVE:
                continue
            spec = self._spec(name, raw)
            if spec is None:
                continue
            found = [text(h) for h in handlers]
            if may_serve(spec, found, labels=self.labels, allow=self.allow):
                out.append(name)
        return out

    def _spec(self, name: str, raw: Any) -> StoredSpec | None:
        if name in self.specs:
            return self.specs[name]
        spec = None
        if raw is not None:
            try:
                spec = StoredSpec.model_validate_json(raw)
            except ValidationError:
                spec = None  # the run says why, if it ever joins
        if spec is not None and spec.mode != "queue":
            spec = None
        if raw is not None:
            self.specs[name] = spec
        return spec
