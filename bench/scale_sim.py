"""Hundreds of simulated workers in one process, for ``bench.scale``.

Each one does what a real worker does on Redis, through the real scripts and records:
registers (``records.registered_worker``, pool heartbeat, ``assign`` key, ``qw:workers``,
``worker_joined``), beats every second (pool and member heartbeats), notices its assignment
through a keyspace notification, joins its task's node set (``join.lua``), and leaves it
(``depart.lua``, ``member_left``) when the assignment moves. Tasks named ``fresh`` are run:
their subtasks are read (``XREADGROUP``) and settled (``settle.lua``) with a null result, the
``completed`` event is emitted when that finished the task, and the member leaves at once.
Every other task is only held (its subtasks never read): it keeps its node set busy.

Each assignment of a fresh task is reported on the list ``bench:seen`` as
``<task id> <time seen>`` (wall clock), which is how the benchmark times fresh assignments.

    python -m bench.scale_sim --url redis://... --prefix qw --workers 1000 --fresh 10
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
from typing import Any

import redis

from queueworks.protocol import events
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import WorkerRecord
from queueworks.protocol.records import idle_worker, registered_worker
from queueworks.scripts.bound import Scripts

SEEN = "bench:seen"
TTL_MS = 3000
INTERVAL = 1.0


class Sim:
    def __init__(self, r: redis.Redis, prefix: str, workers: int, fresh: int) -> None:
        self.r, self.keys, self.scripts = r, Keys(prefix), Scripts(r)
        self.ids = [f"sim-{i:05d}" for i in range(workers)]
        self.fresh = set(self.ids[:fresh])
        self.task: dict[str, str] = {}  # worker -> task it is a member of
        self.names: dict[str, str] = {}  # task -> name (read once)
        self.started = time.time()
        self.stop = False

    def register(self) -> None:
        k, now = self.keys, time.time()
        pipe = self.r.pipeline(transaction=False)
        for wid in self.ids:
            pool = "fresh" if wid in self.fresh else "busy"
            record = WorkerRecord(
                id=wid,
                host=socket.gethostname(),
                pid=os.getpid(),
                labels={"pool": pool},
                allow=["bench"],
                started_at=self.started,
            )
            pipe.hset(k.worker(wid), mapping=registered_worker(record, now))
            pipe.set(k.worker_heartbeat(wid), repr(now), px=TTL_MS)
            pipe.set(k.assign(wid), "", nx=True)
            pipe.zadd(k.workers, {wid: now})
            events.emit(pipe, k, "worker_joined", worker=wid, labels=json.dumps({"pool": pool}))
            if len(pipe) >= 1000:
                pipe.execute()
        pipe.execute()

    def beat(self) -> None:
        k, now = self.keys, time.time()
        pipe = self.r.pipeline(transaction=False)
        for wid in self.ids:
            pipe.set(k.worker_heartbeat(wid), repr(now), px=TTL_MS)
        pipe.zadd(k.workers, dict.fromkeys(self.ids, now))
        for wid, tid in self.task.items():
            pipe.set(k.task(tid).heartbeat(wid), repr(now), px=TTL_MS, xx=True)
        pipe.execute()

    def assigned(self, wid: str) -> None:
        tid = (self.r.get(self.keys.assign(wid)) or b"").decode()
        old = self.task.get(wid)
        if tid == old:
            return
        if old:
            self.leave(wid, old)
        if not tid:
            return
        name = self.names.get(tid)
        if name is None:
            name = self.names[tid] = (
                self.r.hget(self.keys.task(tid).record, "name") or b""
            ).decode()
        if name == "fresh":
            self.r.rpush(SEEN, f"{tid} {time.time()!r}")
        if self.scripts.join(self.keys.task(tid), wid, TTL_MS, time.time()) is None:
            return  # finished meanwhile
        self.task[wid] = tid
        if name == "fresh":
            self.run(wid, tid)

    def run(self, wid: str, tid: str) -> None:
        tk = self.keys.task(tid)
        reply: Any = self.r.xreadgroup(tk.group, wid, {tk.stream: ">"}, count=100)
        ok = []
        for _, entries in reply or ():
            for entry_id, fields in entries:
                ok.append((entry_id.decode(), int(fields[b"i"]), "null"))
        settled = self.scripts.settle(tk, tk.stream, wid, time.time(), ok)
        if settled.finished:
            events.emit(self.r, self.keys, "completed", task=tid)
        if not settled.active:
            self.leave(wid, tid)

    def leave(self, wid: str, tid: str) -> None:
        epoch = self.scripts.depart(
            self.keys.task(tid), wid, time.time(), "leave", only_if_dead=False
        )
        self.r.hset(self.keys.worker(wid), mapping=idle_worker())
        if epoch:
            events.emit(self.r, self.keys, "member_left", task=tid, worker=wid)
        self.task.pop(wid, None)

    def serve(self) -> None:
        self.r.config_set("notify-keyspace-events", "K$")
        pubsub = self.r.pubsub(ignore_subscribe_messages=True)
        prefix = f"__keyspace@0__:{self.keys.prefix}:worker:"
        pubsub.psubscribe(f"{prefix}*:assign")
        self.register()
        for wid in self.ids:  # assignments made before the subscription was up
            self.assigned(wid)
        next_beat = time.monotonic()
        while not self.stop:
            if time.monotonic() >= next_beat:
                self.beat()
                next_beat = time.monotonic() + INTERVAL
            msg = pubsub.get_message(timeout=0.02)
            while msg is not None:
                channel = msg["channel"].decode()
                self.assigned(channel[len(prefix) : -len(":assign")])
                msg = pubsub.get_message(timeout=0)
        pubsub.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--prefix", default="qw")
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--fresh", type=int, default=10)
    args = ap.parse_args()
    r = redis.Redis.from_url(args.url, socket_timeout=30)
    sim = Sim(r, args.prefix, args.workers, args.fresh)

    def stop(*_: Any) -> None:
        sim.stop = True

    signal.signal(signal.SIGTERM, stop)
    sim.serve()


if __name__ == "__main__":
    main()


def noop(payload: Any = None) -> None:
    """The handler the benchmark's tasks name (the simulated workers never import it)."""
