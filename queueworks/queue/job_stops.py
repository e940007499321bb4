"""A running job cancelled (``job.cancel()``): its worker is told to stop it.

``cancel_job.lua`` cancels a running job at once (its entry leaves the stream: nobody
reclaims or retries it) and names the member that runs it; the canceller then appends
``QUEUE\\tJOB_ID`` to that worker's stop list (``ask_stop``). The worker's heartbeat takes
the list on each tick it already makes (``take_stops``: one command more on its pipeline,
whatever the number of queues) and stops the call (``workers.stopping.Running.cancel``).
A list whose worker died expires by itself (``STOPS_KEPT``).
"""

from __future__ import annotations

from typing import Any

from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import text

STOPS_KEPT = 60  # s a stop list lives after its last request (a dead worker's goes)
STOPS_READ = 100  # requests a heartbeat takes at once


def ask_stop(pipe: Any, keys: Keys, worker: str, queue: str, job_id: str) -> None:
    """Queue on ``pipe``: ``worker`` is to stop job ``job_id`` of ``queue``."""
    key = keys.worker_stops(worker)
    pipe.rpush(key, f"{queue}\t{job_id}")
    pipe.expire(key, STOPS_KEPT)


def take_stops(pipe: Any, keys: Keys, worker: str) -> None:
    """Queue on ``pipe``: take ``worker``'s stop requests (``stops_of`` reads the reply)."""
    pipe.lpop(keys.worker_stops(worker), STOPS_READ)


def stops_of(reply: Any) -> list[tuple[str, str]]:
    """The (queue, job id) pairs a ``take_stops`` replied; none from a reply that is not."""
    if not isinstance(reply, list):
        return []
    pairs = [text(item).partition("\t") for item in reply if isinstance(item, bytes | str)]
    return [(queue, job_id) for queue, tab, job_id in pairs if tab]
