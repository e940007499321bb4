"""Workers share a queue's jobs in turn: Redis hands a stream's new entry to the reader that
has waited longest, so a worker keeps its place by not re-sending its read while it waits.
A call in flight that ends ends the read from its own thread (``CLIENT UNBLOCK``:
``queueworks.transport.unblock``), and a wait shorter than Redis can time is waited in the
worker (``QueueSet.read``). Real Redis, real processes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from queueworks import Client
from queueworks.contrib.redis_server import RedisServer
from queueworks.transport.unblock import ReadWaker, pool_client_id
from queueworks.transport.wire import StreamReads
from queueworks.workers.queue_set import LOCAL_WAIT_MS
from tests.conftest import Cluster, wait_for
from tests.test_queue_membership import TTL, members_of

LONG_BLOCK_MS = 20_000


def blocked_read(
    r: redis.Redis, read: Any, waker: ReadWaker
) -> tuple[threading.Thread, dict[str, float]]:
    """``read()`` (a read that waits ``LONG_BLOCK_MS``) on a thread; the seconds it took."""
    took: dict[str, float] = {}

    def run() -> None:
        t = time.monotonic()
        took["reply"] = read()
        took["s"] = time.monotonic() - t

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: waker.client is not None, 10, "the read under way")
    wait_for(
        lambda: any(
            c.get("cmd") == "xreadgroup" and int(c["id"]) == waker.client for c in r.client_list()
        ),
        10,
        "the read blocked on the server",
    )
    return thread, took


@pytest.mark.system
def test_a_call_that_ends_ends_the_read_that_waits(r: redis.Redis, prefix: str) -> None:
    """Both reads a worker sends (pre-built on a kept connection, and on a pipeline with
    the round's settles and checks) end when ``wake`` is called, not at their timeout."""
    stream = f"{prefix}:s"
    r.xgroup_create(stream, "g", id="$", mkstream=True)
    waker = ReadWaker(r, threading.Event(), ended=lambda: False)
    reads = StreamReads.of(r, "g", "c")
    assert reads is not None

    def line_read() -> Any:
        return reads({stream: ">"}, 1, LONG_BLOCK_MS, waker)

    def pipe_read() -> Any:
        pipe = r.pipeline(transaction=False)
        pipe.get(f"{prefix}:other")
        pipe.connection = r.connection_pool.get_connection()
        block = LONG_BLOCK_MS if waker.blocking(pool_client_id(pipe.connection)) else None
        pipe.xreadgroup("g", "c", {stream: ">"}, count=1, block=block)
        try:
            return pipe.execute()[-1]
        finally:
            waker.done()

    for read in (line_read, pipe_read):
        thread, took = blocked_read(r, read, waker)
        waker.wake()
        thread.join(LONG_BLOCK_MS / 1000)
        assert took["s"] < LONG_BLOCK_MS / 2000, (read.__name__, took)
        assert not took["reply"]
        assert waker.client is None and waker.event.is_set()
    reads.close()


@pytest.mark.system
def test_a_read_does_not_wait_once_a_call_ended(r: redis.Redis, prefix: str) -> None:
    """A call that ended before the read was sent (its ``wake`` found no read to end): the
    read does not wait at all."""
    stream = f"{prefix}:s"
    r.xgroup_create(stream, "g", id="$", mkstream=True)
    waker = ReadWaker(r, threading.Event(), ended=lambda: True)
    reads = StreamReads.of(r, "g", "c")
    assert reads is not None
    t = time.monotonic()
    assert reads({stream: ">"}, 1, LONG_BLOCK_MS, waker) is None
    assert time.monotonic() - t < LONG_BLOCK_MS / 2000
    reads.close()


@pytest.mark.system
def test_workers_with_calls_in_flight_keep_their_turn(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """w1 and w2 (--concurrency 2) each run a long job and have a slot free; w3 has nothing
    running. Fast jobs come one at a time: the three take them in turn. (A worker that
    re-sent its read every few ms to look for ended calls went to the back of the stream's
    waiting readers each time: w3, waiting longest, took every other job.)"""
    fast = client.queue("fast")
    slow_a, slow_b = client.queue("slow-a"), client.queue("slow-b")
    conc = ["--concurrency", "2", *TTL]
    cluster.worker("w1", extra=[*conc, "--queues", "fast,slow-a"])
    cluster.worker("w2", extra=[*conc, "--queues", "fast,slow-b"])
    cluster.worker("w3", extra=[*TTL, "--queues", "fast"])
    wait_for(lambda: members_of(client, "fast") == ["w1", "w2", "w3"], 30, "all in fast")
    wait_for(lambda: members_of(client, "slow-a") == ["w1"], 30, "w1 in slow-a")
    wait_for(lambda: members_of(client, "slow-b") == ["w2"], 30, "w2 in slow-b")
    long_jobs = [q.enqueue("tests.handlers:sleep_for", {"seconds": 20.0}) for q in (slow_a, slow_b)]
    wait_for(lambda: all(j.status().state == "running" for j in long_jobs), 20, "long jobs")
    log = f"{prefix}:fast-starts"
    n = 120
    for _ in range(n):
        fast.enqueue("tests.handlers:job_logged", {"x": 1, "log": log})
        time.sleep(0.025)
    wait_for(lambda: r.llen(log) == n, 30, "every fast job started")
    took = {"w1": 0, "w2": 0, "w3": 0}
    for raw in r.lrange(log, 0, -1):
        took[raw.decode().split("|")[1]] += 1
    print("fast jobs taken", took)
    # in turn: a third each (loaded machines blur it); w3 took half of them before
    assert took["w3"] <= 0.42 * n and min(took["w1"], took["w2"]) >= 0.24 * n, took


@pytest.mark.system
@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_no_read_asks_redis_for_a_wait_it_cannot_time(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str, concurrency: str
) -> None:
    """Redis ends a blocking read's wait when its event loop next wakes (up to 100 ms with
    its default ``hz``) if nothing else comes: the settle's wait of a few ms is the
    worker's own, never a ``BLOCK`` under ``LOCAL_WAIT_MS``."""
    q = client.queue("q")
    cluster.worker("w1", extra=["--concurrency", concurrency, "--queues", "q"])
    wait_for(lambda: members_of(client, "q") == ["w1"], 30, "w1 in q")
    blocks: list[int] = []
    seen = threading.Event()
    done = threading.Event()

    def monitor() -> None:
        with r.monitor() as m:
            seen.set()
            for command in m.listen():
                words = command["command"].split()
                if words[0] == "XREADGROUP" and "BLOCK" in words:
                    blocks.append(int(words[words.index("BLOCK") + 1]))
                if done.is_set():
                    return

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    seen.wait(10)
    for i in range(20):
        assert q.enqueue("tests.handlers:double", {"x": i}).result(timeout=30) == 2 * i
    done.set()
    r.ping()  # (the monitor's last look)
    watcher.join(10)
    assert blocks, "the worker's reads were seen"
    assert min(blocks) >= LOCAL_WAIT_MS, sorted(blocks)[:10]


@pytest.mark.system
def test_a_user_without_client_unblock_still_runs_jobs_in_flight(
    prefix: str, tmp_path: Path
) -> None:
    """A least-privilege ACL user (``-@dangerous``: no ``CLIENT UNBLOCK``): a worker with
    ``--concurrency 2`` finds it refused once, then re-sends its read every few ms while
    calls run; every job's result still comes, and the worker keeps going."""
    with RedisServer(password="admin-pw", notify_keyspace_events="K$gx") as server:
        admin = server.client()
        admin.execute_command(
            "ACL", "SETUSER", "qw", "reset", "on", ">qw-pw", f"~{prefix}:*", "&*",
            "+@all", "-@dangerous",
        )  # fmt: skip
        admin.close()
        url = f"redis://qw:qw-pw@127.0.0.1:{server.port}/0"
        cluster = Cluster(url, prefix, tmp_path)
        try:
            with Client.from_url(url, prefix=prefix) as client:
                q = client.queue("q")
                worker = cluster.worker("w1", extra=["--concurrency", "2", "--queues", "q"])
                # a job that ends while the worker waits for more asks for the unblock (one
                # ending in the millisecond the read is sent again finds none to end: try
                # again)
                for _ in range(10):
                    slow = q.enqueue("tests.handlers:sleep_for", {"seconds": 0.5})
                    for i in range(5):
                        job = q.enqueue("tests.handlers:double", {"x": i})
                        assert job.result(timeout=30) == 2 * i
                    assert slow.result(timeout=30) is None
                    if "client_unblock_refused" in worker.log():
                        break
            assert worker.alive(), cluster.logs()
            assert "client_unblock_refused" in worker.log(), worker.log()
        finally:
            cluster.close()
