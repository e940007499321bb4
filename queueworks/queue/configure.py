"""A live queue's settings changed (``Queue.configure``, ``AsyncQueue.configure``, the
dashboard's queue form, ``queueworks queue QUEUE set``), planned once
(``queueworks.transport.plans``).

The queue's spec in its record is the one place its settings live: ``configure_queue.lua``
writes the new one (only over the spec that was read: two configures at once both land) and
bumps the record's settings version. Each member reads that version with the membership
check it already makes while it reads the queue, and reads the spec again when it changed
(``workers.queue_loop.QueueLoop.settings_seen``): the jobs it starts from then on run with
the new settings, within a second; a job already running keeps the ones it started with.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from queueworks.errors import TaskNotFound
from queueworks.protocol import events
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import StoredSpec
from queueworks.queue.queue_admin import queue_spec
from queueworks.queue.queue_settings import QueueSettings, check_live_settings, configured_spec
from queueworks.scripts import calls
from queueworks.transport.plans import Plan, Trip, alone

TRIES = 10  # configure_queue calls: each but the last found the spec changed meanwhile


def plan_configure(keys: Keys, name: str, given: Mapping[str, Any]) -> Plan[QueueSettings]:
    """Change queue ``name``'s ``given`` settings (checked first: ``ValueError`` naming a
    bad one, ``TypeError`` one that is no live setting); its settings now. ``TaskNotFound``
    for a name that is no queue."""
    changes = check_live_settings(given)
    for _ in range(TRIES):
        qk, raw, stored = yield from queue_spec(keys, name)
        if not changes:
            return QueueSettings.of(stored)
        spec = StoredSpec.model_validate(configured_spec(json.loads(raw), changes))
        new = spec.spec_json()
        version = (yield alone(calls.configure_queue(qk, raw, new)))[0]
        if version < 0:
            raise TaskNotFound(f"queue {name}")
        if version > 0:
            trip = Trip()
            events.emit(trip, keys, "configured", task=name, settings=json.dumps(changes))
            yield trip
            return QueueSettings.of(spec)
    raise RuntimeError(f"queue {name!r}: its settings changed {TRIES} times while configured")
