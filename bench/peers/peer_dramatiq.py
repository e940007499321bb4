"""Dramatiq with its Redis broker and default middleware: one ``dramatiq`` command with
``--processes N`` (default 8 threads each), or N commands of one process for the kill test."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware

from bench.peers import jobs
from bench.peers.harness import Peer

QUEUE = "dramatiq:default"


class _Ready(Middleware):
    def after_worker_boot(self, broker: Any, worker: Any) -> None:
        jobs.mark_ready("dramatiq")


broker = RedisBroker(url=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
broker.add_middleware(_Ready())
dramatiq.set_broker(broker)


@dramatiq.actor
def noop(i: int) -> None:
    jobs.noop(i)


@dramatiq.actor
def stamp(sent: float) -> None:
    jobs.stamp(sent)


@dramatiq.actor
def hold(seconds: float) -> None:
    jobs.hold(seconds)


class Driver(Peer):
    name = "dramatiq"

    def start_workers(self, n: int, *, separate: bool) -> None:
        exe = str(Path(sys.executable).with_name("dramatiq"))
        shape = [1] * n if separate else [n]
        for k, procs in enumerate(shape):
            self.spawn([exe, "bench.peers.peer_dramatiq", "--processes", str(procs)], f"w{k}")

    def prepare(self) -> None:
        broker.client.ping()

    def enqueue_noop(self, n: int) -> None:
        for i in range(n):
            noop.send(i)

    def enqueue_each(self, n: int) -> None:
        self.enqueue_noop(n)  # send is one call per job already

    def remaining(self) -> int:
        return int(self.r.hlen(QUEUE + ".msgs"))

    def enqueue_stamp(self, sent: float) -> None:
        stamp.send(sent)

    def enqueue_hold(self, seconds: float) -> None:
        hold.send(seconds)

    def job_state(self) -> str:
        now_ms = time.time() * 1000
        beats = {
            w.decode(): (now_ms - score) / 1000
            for w, score in self.r.zrange("dramatiq:__heartbeats__", 0, -1, withscores=True)
        }
        for key in self.r.scan_iter(match="dramatiq:__acks__.*.default"):
            if self.r.scard(key):
                worker = key.decode().split("__acks__.")[1].rsplit(".", 1)[0]
                age = beats.get(worker)
                seen = f"last heartbeat {age:.0f} s ago" if age is not None else "no heartbeat"
                return (
                    f"message unacked in the dead worker's ack set ({seen}); requeued only by"
                    f" a random maintenance pass ({broker.maintenance_chance} per million"
                    f" commands) after heartbeat_timeout={broker.heartbeat_timeout / 1000:.0f} s"
                )
        return f"not in any ack set; {self.r.llen(QUEUE)} queued, {self.remaining()} unfinished"
