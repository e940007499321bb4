"""A blocking read that another thread can end early (``CLIENT UNBLOCK``).

A worker with ``--concurrency N`` runs jobs on other threads while its own thread waits for
more jobs in one blocking ``XREADGROUP``. When a job ends, its outcome should be recorded
at once, so the read must end. Re-sending the read every few milliseconds to look would do
it, but Redis hands a stream's new entry to the reader that has waited longest: a worker
that re-sends its read goes to the back of that line each time, and the other workers of the
queue take its share of the jobs. So the read waits as long as it likes and the thread whose
job ended sends ``CLIENT UNBLOCK`` with the read's connection id (the read then returns
nothing, as on its timeout).

A user whose ACL denies ``CLIENT UNBLOCK`` (it is ``@dangerous``) turns this off: the member
thread then re-sends its read every 20 ms while calls run
(``workers.queue_set.WAIT_SECONDS``), and workers take a queue's jobs less evenly.

The race: a job may end after the member thread decided to wait and before its read reached
the server. ``blocking`` is told the connection first and then asks whether a job ended
(then the read does not wait); ``wake`` hands the job back first and then looks for a
connection, trying ``TRIES`` times ``PAUSE`` apart while the same read is under way: an
unblock that came before the read is tried again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import RedisError, ResponseError

__all__ = ["ReadWaker", "pool_client_id"]


def pool_client_id(conn: Any) -> int:
    """The server's id of a redis-py connection taken from its pool (``CLIENT ID``, asked
    once per socket)."""
    known = getattr(conn, "qw_client", None)
    if known is not None and known[0] is conn._sock:
        return int(known[1])
    conn.send_command("CLIENT", "ID")
    client = int(conn.read_response())
    conn.qw_client = (conn._sock, client)
    return client


class ReadWaker:
    """Ends the member thread's blocking read when a call in flight ends.

    ``ended`` says whether a call ended that the member thread has not collected; ``wake``
    (from the thread whose call ended) also sets ``event``, for a read that waits on it
    instead (many queues: ``workers.ready``; a cluster)."""

    TRIES = 20
    PAUSE = 0.0005

    def __init__(
        self, r: Any, event: threading.Event, ended: Callable[[], bool], log: Any = None
    ) -> None:
        self.r, self.event, self.ended, self.log = r, event, ended, log
        self.client: int | None = None  # the connection of the read under way, if it waits
        self.reads = 0  # reads that waited, so far (which read ``client`` is of)
        # False once the server refused ``CLIENT UNBLOCK``: the member thread's read then
        # waits a short while at a time (``workers.queue_set.Flight``)
        self.allowed = True

    def blocking(self, client: int) -> bool:
        """The read about to be sent on connection ``client`` may wait: False if a call
        ended meanwhile (the read then must not wait). ``done`` when it returned."""
        self.reads += 1
        self.client = client
        return not self.ended()

    def done(self) -> None:
        self.client = None

    def wake(self) -> None:
        """A call ended (handed back already): end the read that waits, if one does. Never
        raises (it runs on the call's thread): a user whose ACL denies ``CLIENT UNBLOCK``
        (``-@dangerous``) turns it off (``allowed``); a lost connection ends the read
        anyway."""
        self.event.set()
        reads = self.reads
        for _ in range(self.TRIES):
            client = self.client
            if client is None or self.reads != reads or not self.allowed:
                return
            try:
                if self.r.client_unblock(client):
                    return
            except ResponseError as exc:  # NOPERM
                self.allowed = False
                if self.log is not None:
                    self.log.info("client_unblock_refused", error=str(exc))
                return
            except RedisError:
                return
            time.sleep(self.PAUSE)
