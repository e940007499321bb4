"""queueworks through its public API and real processes (``python -m queueworks ...``).

A queueworks *job* is a subtask: throughput and enqueue put all N jobs in one task (its
unit of work); latency submits one task of one subtask per job (each then needs the
controller to give it a node, which the latency includes); recovery runs one task of one
long subtask on two workers with the default settings (heartbeat TTL 3 s).

Variant ``tasks`` (``queueworks-tasks``): throughput with one task of one subtask per job
(``max_nodes=1``), i.e. queueworks used as a plain job queue.

Variant ``queue`` (``queueworks-queue``): a queue (``client.queue("bench")``, default
settings), its members already blocked on its stream: a job is ``q.enqueue(handler,
payload)`` (``enqueue_each``, the latency stamps, the hold job) or ``q.enqueue_many``
(``enqueue_noop``: the bulk API); workers are ready once they are members of its node set.

Variant ``async`` (``queueworks-async``): the same queue, jobs enqueued from asyncio by
``AsyncClient`` (``await q.enqueue(handler, payload)``, one call per job: ``enqueue_async``),
``async def`` handlers, and workers started with ``--concurrency`` (``Peer.concurrency``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from bench.common import Procs
from bench.peers.harness import Peer, produce
from queueworks import AsyncClient, Client, Task, TaskNotFound, TaskSpec
from queueworks.client.aio_queue_handle import AsyncQueue
from queueworks.client.queue_handle import Job

NOOP = "queueworks.examples:noop"
QUEUE = "bench"

PREFIX = "qw"


class Driver(Peer):
    name = "queueworks"

    def __init__(self, url: str, logdir: Path, variant: str | None = None) -> None:
        super().__init__(url, logdir, variant)
        self.client = Client.from_url(url, prefix=PREFIX)
        self.tasks: list[Task] = []
        self.task_per_job = variant == "tasks"
        self.queue = self.client.queue(QUEUE) if variant in ("queue", "async") else None
        self.expected = 0
        self.hold: Job | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.aqueue: AsyncQueue | None = None
        if variant == "async":
            self.loop = asyncio.new_event_loop()
            self.aclient = AsyncClient.from_url(url, prefix=PREFIX)
            self.aqueue = self.loop.run_until_complete(self.aclient.queue(QUEUE))

    def start_workers(self, n: int, *, separate: bool) -> None:
        env = {**self.env(), **Procs(self.url, PREFIX).env, "BENCH_REDIS_URL": self.url}
        cmd = [sys.executable, "-m", "queueworks"]
        self.spawn([*cmd, "controller"], "controller", env)
        for i in range(n):
            allow = ["--allow", "queueworks.examples", "--allow", "bench.peers.jobs"]
            many = ["--concurrency", str(self.concurrency)] if self.concurrency else []
            self.spawn([*cmd, "worker", "--name", f"w{i}", *allow, *many], f"w{i}", env)

    def ready(self) -> int:
        if self.queue is not None:  # members of the queue's node set, blocked on its stream
            return int(self.r.zcard(self.queue.keys.members))
        return int(self.r.zcard(self.client.keys.workers))

    def prepare(self) -> None:
        self.client.redis.ping()

    def enqueue_noop(self, n: int) -> None:
        if self.queue is not None:
            self.queue.enqueue_many((NOOP, {"x": i}) for i in range(n))
            self.expected += n
            return
        if self.task_per_job:  # queueworks used as a plain job queue: one task per job
            for i in range(n):
                self.client.submit(
                    TaskSpec(
                        name="noop",
                        handler="queueworks.examples:noop",
                        subtasks=[{"x": i}],
                        max_nodes=1,
                    )
                )
            return
        subtasks = ({"x": i} for i in range(n))
        spec = TaskSpec(name="noop", handler="queueworks.examples:noop", subtasks=subtasks)
        self.tasks.append(self.client.submit(spec))

    def enqueue_each(self, n: int) -> None:
        if self.queue is None:
            raise NotImplementedError("one call per job: the queue variant or the tasks one")
        enqueue = self.queue.enqueue
        for i in range(n):
            enqueue(NOOP, {"x": i})
        self.expected += n

    def enqueue_async(self, n: int, producers: int, deadline: float) -> int:
        if self.loop is None or self.aqueue is None:
            raise NotImplementedError("asyncio: the async variant")
        enqueue = self.aqueue.enqueue
        handler = "bench.peers.jobs:qw_acount" if self.counting else "bench.peers.jobs:qw_anoop"

        async def call(i: int) -> None:
            await enqueue(handler, {"i": i})

        sent = self.loop.run_until_complete(produce(n, producers, deadline, call))
        self.expected += sent
        return sent

    def remaining(self) -> int:
        if self.queue is not None:
            done, dead = self.r.hmget(self.queue.keys.record, ["done", "dead"])
            return self.expected - int(done or 0) - int(dead or 0)
        if self.task_per_job:  # tasks the controller has not yet seen finish and released
            return int(self.r.zcard(self.client.keys.queue))
        left = 0
        for task in self.tasks:
            try:
                status = task.status(with_nodes=False)
            except TaskNotFound:
                continue
            left += status.total - status.done - status.dead
        return left

    def enqueue_stamp(self, sent: float) -> None:
        if self.queue is not None:
            self.queue.enqueue("bench.peers.jobs:qw_stamp", {"sent": sent})
            self.expected += 1
            return
        spec = TaskSpec(
            name="stamp", handler="bench.peers.jobs:qw_stamp", subtasks=[{"sent": sent}]
        )
        self.client.submit(spec)

    def enqueue_hold(self, seconds: float) -> None:
        if self.queue is not None:
            self.hold = self.queue.enqueue("bench.peers.jobs:qw_hold", {"seconds": seconds})
            return
        spec = TaskSpec(
            name="hold", handler="bench.peers.jobs:qw_hold", subtasks=[{"seconds": seconds}]
        )
        self.tasks = [self.client.submit(spec)]

    def job_state(self) -> str:
        if self.hold is not None:
            job = self.hold.status()
            assert self.queue is not None
            nodes = ", ".join(n.worker for n in self.queue.task.status().nodes)
            return f"job {job.state.value}, attempts {job.attempts}, nodes: {nodes or 'none'}"
        status = self.tasks[-1].status()
        nodes = ", ".join(n.worker for n in status.nodes) or "none"
        return f"task {status.state.value}, done {status.done}/{status.total}, nodes: {nodes}"

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.aclient.close())
            self.loop.close()
        self.client.close()
        super().close()
