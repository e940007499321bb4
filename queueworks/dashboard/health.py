"""What is wrong with a queue, in plain sentences (``QueueSummary.warnings``): what the
overview, the queue list and the queue's page show as a badge, and ``/api/queues`` lists.

A pure function of a queue's row and of its members whose worker is lost (no pool
heartbeat): no read of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from queueworks.dashboard.views import QueueSummary

LOST_SHOWN = 5  # lost members named in a warning (the rest counted)


def _jobs(n: int) -> str:
    return f"{n} job{'' if n == 1 else 's'}"


def queue_warnings(q: QueueSummary, lost: Sequence[str]) -> list[str]:
    """The warnings of queue ``q`` (none for a finished queue: nothing of it runs again);
    ``lost``: its members whose worker is lost."""
    if q.finished:
        return []
    out = []
    if q.paused and q.backlog:
        out.append(f"Paused with {_jobs(q.backlog)} waiting: no member reads a new job.")
    if not q.nodes and (q.backlog or q.running):
        out.append(
            f"No member serves this queue and {_jobs(q.backlog + q.running)} wait: no live "
            "worker may run its jobs (check the workers' --allow, --queues and the queue's "
            "node_selector)."
        )
    for handler, n in sorted(q.set_aside.items()):
        out.append(f"{_jobs(n)} of {handler} wait: no member may run that handler.")
    if lost:
        named = ", ".join(sorted(lost)[:LOST_SHOWN])
        more = f" and {len(lost) - LOST_SHOWN} more" if len(lost) > LOST_SHOWN else ""
        out.append(
            f"{len(lost)} member{'' if len(lost) == 1 else 's'} on lost workers ({named}{more}): "
            "their jobs are claimed again when their heartbeat expires."
        )
    return out
