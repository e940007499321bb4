"""RQ: ``rq worker`` processes, the default forking ``Worker`` or (variant ``simple``)
``SimpleWorker``; jobs enqueued with ``Queue.enqueue_many`` (one pipeline per batch)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rq import Queue
from rq.defaults import DEFAULT_MAINTENANCE_TASK_INTERVAL
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

from bench.peers import jobs
from bench.peers.harness import Peer

BATCH = 1000  # jobs per enqueue_many pipeline


class Driver(Peer):
    name = "rq"

    def __init__(self, url: str, logdir: Path, variant: str | None = None) -> None:
        super().__init__(url, logdir, variant)
        self.simple = variant == "simple"
        self.name = "rq-simple" if self.simple else "rq"
        self.queue = Queue("default", connection=self.r)
        self.expected = 0
        self.hold_id: str | None = None

    def start_workers(self, n: int, *, separate: bool) -> None:
        rq = str(Path(sys.executable).with_name("rq"))
        extra = ["--worker-class", "rq.SimpleWorker"] if self.simple else []
        for i in range(n):
            argv = [rq, "worker", "--url", self.url, "--quiet", "--name", f"w{i}", *extra]
            self.spawn(argv, f"w{i}")

    def ready(self) -> int:
        return int(self.r.scard("rq:workers"))

    def enqueue_noop(self, n: int) -> None:
        for start in range(0, n, BATCH):
            batch = range(start, min(n, start + BATCH))
            self.queue.enqueue_many([Queue.prepare_data(jobs.noop, (i,)) for i in batch])
        self.expected += n

    def enqueue_each(self, n: int) -> None:
        enqueue = self.queue.enqueue
        for i in range(n):
            enqueue(jobs.noop, i)
        self.expected += n

    def remaining(self) -> int:
        finished = self.r.zcard(FinishedJobRegistry(queue=self.queue).key)
        failed = self.r.zcard(FailedJobRegistry(queue=self.queue).key)
        return self.expected - int(finished) - int(failed)

    def enqueue_stamp(self, sent: float) -> None:
        self.queue.enqueue(jobs.stamp, sent)

    def enqueue_hold(self, seconds: float) -> None:
        self.hold_id = self.queue.enqueue(jobs.hold, seconds).id

    def job_state(self) -> str:
        assert self.hold_id is not None
        status = Job.fetch(self.hold_id, connection=self.r).get_status(refresh=True).value
        cleanup = (
            f"a worker's maintenance pass (every {DEFAULT_MAINTENANCE_TASK_INTERVAL // 60} min)"
            " then moves it to FailedJobRegistry as abandoned; RQ re-runs an abandoned job only"
            " if it was enqueued with a Retry"
        )
        started = StartedJobRegistry(queue=self.queue).key
        for member, score in self.r.zrange(started, 0, -1, withscores=True):
            if member.decode().startswith(self.hold_id):
                left = score - time.time()
                when = f"passed {-left:.0f} s ago" if left < 0 else f"is in {left:.0f} s"
                return (
                    f"job status '{status}', in StartedJobRegistry (its deadline there {when});"
                    f" {cleanup}"
                )
        failed = self.r.zscore(FailedJobRegistry(queue=self.queue).key, self.hold_id) is not None
        return f"job status '{status}'{', in FailedJobRegistry' if failed else ''}"
