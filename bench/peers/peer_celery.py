"""Celery with the Redis broker and ``acks_late``: one ``celery worker`` node with a prefork
pool of N processes (``-c N``), or N nodes of one process each for the kill test."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_process_init, worker_ready

from bench.peers import jobs
from bench.peers.harness import Peer

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.task_acks_late = True  # the one setting the comparison asks for: redeliver on a crash
app.conf.broker_connection_retry_on_startup = True


@app.task(name="noop")
def noop(i: int) -> None:
    jobs.noop(i)


@app.task(name="stamp")
def stamp(sent: float) -> None:
    jobs.stamp(sent)


@app.task(name="hold")
def hold(seconds: float) -> None:
    jobs.hold(seconds)


@worker_process_init.connect
def _process_ready(**_: Any) -> None:
    jobs.mark_ready("celery-proc")


@worker_ready.connect
def _node_ready(**_: Any) -> None:
    jobs.mark_ready("celery-node")


class Driver(Peer):
    name = "celery"

    def __init__(self, url: str, logdir: Path, variant: str | None = None) -> None:
        super().__init__(url, logdir, variant)
        self.nodes = 0

    def start_workers(self, n: int, *, separate: bool) -> None:
        celery = str(Path(sys.executable).with_name("celery"))
        base = [celery, "-A", "bench.peers.peer_celery", "worker", "-l", "warning"]
        shape = [1] * n if separate else [n]
        for k, procs in enumerate(shape):
            self.spawn([*base, "-c", str(procs), "-n", f"w{k}@%h"], f"w{k}")
        self.nodes = len(shape)

    def ready(self) -> int:
        marks = [m.decode() for m in self.r.lrange(jobs.READY_KEY, 0, -1)]
        if sum(m.startswith("celery-node") for m in marks) < self.nodes:
            return 0
        return sum(m.startswith("celery-proc") for m in marks)

    def prepare(self) -> None:
        with app.producer_or_acquire() as producer:
            producer.connection.ensure_connection()

    def enqueue_noop(self, n: int) -> None:
        with app.producer_or_acquire() as producer:
            for i in range(n):
                noop.apply_async((i,), producer=producer)

    def enqueue_each(self, n: int) -> None:
        self.enqueue_noop(n)  # apply_async is one publish per job already

    def remaining(self) -> int:
        return int(self.r.llen("celery")) + int(self.r.hlen("unacked"))

    def enqueue_stamp(self, sent: float) -> None:
        stamp.apply_async((sent,))

    def enqueue_hold(self, seconds: float) -> None:
        hold.apply_async((seconds,))

    def job_state(self) -> str:
        unacked, queued = int(self.r.hlen("unacked")), int(self.r.llen("celery"))
        timeout = app.conf.broker_transport_options.get("visibility_timeout", 3600)
        return (
            f"message unacked ({unacked} in 'unacked', {queued} queued): redelivered only"
            f" after visibility_timeout={timeout} s"
        )
