"""A member's part in its queue's flow control (``queueworks.queue.flow``): the rate gate its reads
pass through (``RateGate``) and the group slots its jobs take before they run
(``GroupSlots``).

A rate-limited queue's streams are not in the worker's one ``XREADGROUP``: the gate reads
them with ``rate_read.lua`` on the same pipeline (one round trip still), only as many
entries as the bucket has tokens. Out of tokens, the gate waits until the next one is due
(the reply says when) and the queue is not read until then; the worker's other queues are
read as ever. A gate whose queue had nothing to read looks again every ``POLL_SECONDS``
(a job enqueued there starts up to that much later than on an unlimited queue).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from queueworks.protocol.jobrecords import JOB_STATE, JobEntry
from queueworks.protocol.keys import TaskKeys
from queueworks.protocol.messages import text
from queueworks.protocol.models import JobState
from queueworks.queue.flow import heads_of, heads_reads, plan_pump
from queueworks.queue.queues import ENTRY_ID
from queueworks.scripts.bound import Queued, Scripts
from queueworks.scripts.flow_calls import Read, band_read, rate_read
from queueworks.transport.runner import run as run_plan

from .aside import Aside
from .loop import Run
from .work import Work

POLL_SECONDS = 0.02  # a gate whose queue had nothing to read looks again this often
SWEEP_COUNT = 100  # holders the leader's backstop looks at per pass
PUMP_SECONDS = 1.0  # the leader's backstop pump of waiting groups, this often
DUE_BLOCK_MS = 5  # a read with a gate due blocks at most this long on the other queues
BAND_READ = 10  # entries an ordered read takes at most: a job of a higher band that comes
# behind a deep backlog is read after at most so many others have started


class RateGate:
    """When this member may next read its rate-limited queue, and the read itself."""

    def __init__(self, run: Run, rate: float, aside: Aside) -> None:
        self.run, self.rate, self.aside = run, rate, aside
        self.next_at = 0.0  # monotonic: when to read again
        self.sent: Queued[tuple[Read, int]] | None = None

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def block_ms(self, now: float) -> int:
        """How long a read of the other queues may block before this gate is due."""
        if self.due(now):
            return DUE_BLOCK_MS
        return max(1, int((self.next_at - now) * 1000))

    def put(self, pipe: Any, want: int) -> None:
        """Put the gated read of the queue's streams (and the aside streams its member
        reads) on ``pipe``; ``took`` reads its reply."""
        run = self.run
        call = rate_read(run.tk, list(self.aside.read), run.me, self.rate, want)
        self.sent = Queued(run.scripts, call, pipe)

    def took(self, replies: list[Any], now: float) -> Read:
        """What the read put on the pipe brought (entries are ``XREADGROUP``'s shape)."""
        sent, self.sent = self.sent, None
        if sent is None:
            return []
        read, wait_ms = sent.reply(replies)
        if read:
            self.next_at = now  # more may wait: read again at once
        elif wait_ms:
            self.next_at = now + wait_ms / 1000
        else:
            self.next_at = now + POLL_SECONDS
        return read


class BandGate:
    """The ordered read of a queue whose jobs use priority bands
    (``queueworks.protocol.priorities``),
    without a rate gate (whose read is in the same order): ``band_read.lua`` on the read's
    pipeline, filling the read from the highest band with jobs first, so a lower band's
    jobs are not read while a higher one has any. Once such a read found nothing, the
    queue's streams are in the worker's blocking ``XREADGROUP`` again (a job that comes
    wakes it, as on any queue) until a read of them brings a job."""

    def __init__(self, run: Run, aside: Aside) -> None:
        self.run, self.aside = run, aside
        self.drained = False  # the last ordered read found nothing: wait with the others
        self.sent: Queued[Read] | None = None

    def ordered(self) -> bool:
        """Whether this round reads the queue through the gate (bands in use, and jobs
        there the last time it looked)."""
        return bool(self.aside.bands) and not self.drained

    def woke(self) -> None:
        """A read of the queue's streams with the others brought jobs: more may wait."""
        self.drained = False

    def put(self, pipe: Any, want: int) -> None:
        run = self.run
        call = band_read(run.tk, list(self.aside.read), run.me, min(want, BAND_READ))
        self.sent = Queued(run.scripts, call, pipe)

    def took(self, replies: list[Any]) -> Read:
        sent, self.sent = self.sent, None
        if sent is None:
            return []
        read = sent.reply(replies)
        self.drained = not read
        return read


class GroupSlots:
    """The slots of a queue with a ``group_limit``: a job of a group takes one before it
    runs, or waits for one off the stream; a settle gives them back (``JobLedger``) and
    the pump hands them on."""

    def __init__(self, run: Run, limit: int) -> None:
        self.run, self.limit = run, limit
        self.pumped_at = time.monotonic()
        self.cursor = 0  # where the sweep of the holders goes on

    def backstop(self) -> None:
        """The leader's, every ``PUMP_SECONDS``: the pump of every group with jobs waiting
        (a settle's pump that never ran: the member died between the two), and a page of
        the slots' holders swept (``sweep_held``)."""
        run = self.run
        role = run.membership.role
        if time.monotonic() - self.pumped_at < PUMP_SECONDS or role is None or not role.leader:
            return
        self.pumped_at = time.monotonic()
        waiting = {text(g): self.limit for g in run.r.hkeys(run.tk.groups_waiting)}
        pump = plan_pump(run.tk, self.limit, waiting)
        if waiting and (moved := run_plan(run.r, run.scripts, pump)):
            run.log.info("group_jobs_pumped", moved=moved)
        self.cursor, freed = sweep_held(run.r, run.scripts, run.tk, self.limit, self.cursor)
        if freed:
            run.log.warning("group_slots_freed", jobs=freed)

    def take(self, work: Work, entry: JobEntry, group: str) -> int:
        """1: the job holds a slot of ``group`` (run it); 0: it waits for one; -1: the
        entry is no longer ours; -2: it names no waiting job."""
        run = self.run
        took = run.scripts.group_take(
            run.tk,
            work.stream,
            work.entry_id,
            run.me,
            entry.job_id,
            group,
            self.limit,
            work.attempt - 1,
            entry.named,
        )
        if took == 0:
            run.log.info(
                "job_waits_for_group",
                job=entry.job_id,
                job_id=entry.job_id,
                queue=run.tk.task_id,
                attempt=work.attempt,
                group=group,
                limit=self.limit,
            )
        return took


class Pump:
    """The hand-on of the slots a settle gave back: the heads of those groups' wait lists
    read on the settle's pipeline (after it), then, if any job waits there, the pump."""

    def __init__(self, pipe: Any, tk: TaskKeys, limit: int, freed: dict[str, int]) -> None:
        self.tk, self.limit = tk, limit
        self.groups = heads_reads(pipe, tk, freed)  # (its reads are the last on the pipe)

    def replies(self, replies: Sequence[Any]) -> Sequence[Any]:
        """``replies`` (the settle's, ending with this read's) without this read's."""
        return replies[: len(replies) - len(self.groups)]

    def run(self, scripts: Scripts, replies: Sequence[Any]) -> int:
        """Pump, if the read found a job waiting (``replies``: the settle's, ending with
        this read's): how many went back onto the stream."""
        heads = heads_of(self.groups, replies[len(replies) - len(self.groups) :])
        if not any(heads.values()):
            return 0
        return scripts.group_pump(self.tk, self.limit, heads)


FINISHED = {JobState.DONE.value.encode(), JobState.DEAD.value.encode()}
FINISHED.add(JobState.CANCELLED.value.encode())


def sweep_held(
    r: Any, scripts: Scripts, tk: TaskKeys, limit: int, cursor: int, count: int = SWEEP_COUNT
) -> tuple[int, list[str]]:
    """A page (``HSCAN`` from ``cursor``) of the jobs holding a group slot: a holder that is
    finished (its record says so) or gone (a job to run now with neither record nor
    entry: its entry deleted while pending) gives its slot back, to the group's next
    waiting job. The next cursor (0: the end) and the jobs freed."""
    cursor, held = r.hscan(tk.groups_held, cursor, count=count)
    jobs = [(text(j), text(g)) for j, g in held.items()]
    if not jobs:
        return cursor, []
    pipe = r.pipeline(transaction=False)
    for job, _ in jobs:
        pipe.hget(tk.job(job), JOB_STATE)
        if ENTRY_ID.match(job):  # a job to run now: its entry, while it is on the stream
            pipe.xrange(tk.stream, job, job)
        else:
            pipe.echo("")
    replies = pipe.execute(raise_on_error=False)
    freed: dict[str, list[str]] = {}
    for i, (job, group) in enumerate(jobs):
        state, entry = replies[2 * i], replies[2 * i + 1]
        gone = state is None and isinstance(entry, list) and not entry
        if state in FINISHED or gone:
            freed.setdefault(group, []).append(job)
    for group, ids in freed.items():
        run_plan(r, scripts, plan_pump(tk, limit, {group: len(ids)}, back=ids))
    return cursor, [j for ids in freed.values() for j in ids]
