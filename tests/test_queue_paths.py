"""The queue's fast paths (issue 18, Performance): ``enqueue_many`` pipelined from a thread
of its own, and a member's settle sent as a bare EVALSHA with its read (no SCRIPT EXISTS
round trip), healed when Redis has lost its scripts. Real Redis, real processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from queueworks import Client
from queueworks.contrib.redis_server import RedisServer
from queueworks.protocol.keys import Keys
from queueworks.queue.queues import ENQUEUE_BATCH, ENQUEUE_PIPELINE
from queueworks.scripts.bound import Scripts
from tests import handlers
from tests.conftest import Cluster, wait_for

PER_PIPELINE = ENQUEUE_BATCH * ENQUEUE_PIPELINE


@pytest.mark.integration
def test_enqueue_many_sends_every_job_in_order_and_leaves_no_thread(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("many")
    tk = keys.task("many")
    threads = threading.active_count()
    n = 2 * PER_PIPELINE + 7  # two pipelines sent from the thread, the last one from here
    jobs = q.enqueue_many(
        ("tests.handlers:double" if i % 2 else handlers.double, {"x": i}) for i in range(n)
    )
    assert len({job.id for job in jobs}) == n
    entries = r.xrange(tk.stream)
    assert [entry_id.decode() for entry_id, _ in entries] == [job.id for job in jobs]
    assert {fields[b"h"] for _, fields in entries} == {b"tests.handlers:double"}
    assert r.smembers(tk.handlers) == {b"tests.handlers:double"}
    assert jobs[-1].status().state == "queued"
    assert threading.active_count() == threads

    def with_a_bad_one() -> Iterator[tuple[str, Any]]:
        for i in range(3 * PER_PIPELINE):
            yield "tests.handlers:double", {"x": object() if i == 2 * PER_PIPELINE + 5 else i}

    with pytest.raises(ValueError, match="payload is not JSON-serializable"):
        q.enqueue_many(with_a_bad_one())
    assert r.xlen(tk.stream) == n + 2 * PER_PIPELINE  # the pipelines sent before it, whole
    assert threading.active_count() == threads


@pytest.mark.system
def test_members_settle_after_redis_lost_its_scripts(tmp_path: Path) -> None:
    with RedisServer() as server:
        server.start()
        r = redis.Redis.from_url(server.url)
        cluster = Cluster(server.url, "noscript", tmp_path)
        client = Client.from_url(server.url, prefix="noscript")
        try:
            cluster.controller()
            worker = cluster.worker()
            cluster.wait_workers(r, 1)
            q = client.queue("q", max_attempts=1)
            first = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(20)]
            assert [job.result(30) for job in first] == [2 * i for i in range(20)]
            before = r.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0)
            for _ in range(3):
                r.script_flush()  # as after a restart or a failover: no script is known
                jobs = q.enqueue_many(
                    [
                        *(("tests.handlers:double", {"x": i}) for i in range(50)),
                        ("tests.handlers:always_fails", {}),
                    ]
                )
                assert [job.result(30) for job in jobs[:-1]] == [2 * i for i in range(50)]
                with pytest.raises(Exception, match="failed 1 time: "):
                    jobs[-1].result(30)
            after = r.info("errorstats").get("errorstat_NOSCRIPT", {}).get("count", 0)
            assert after > before  # the flushes were felt
            status = wait_for(lambda: q.status(), 5, "status")
            assert (status.done, status.dead, status.running, status.backlog) == (170, 3, 0, 0)
            assert worker.alive()
        except BaseException:
            print(cluster.logs())
            raise
        finally:
            cluster.close()
            client.close()
            r.close()


@pytest.mark.system
def test_a_job_on_its_own_is_settled_once_and_before_the_next(tmp_path: Path) -> None:
    """A job arriving while its member waits in a blocking read costs one settle, sent with
    the read after it (not a second one before it runs, however long the read waited)."""
    with RedisServer() as server:
        server.start()
        r = redis.Redis.from_url(server.url)
        cluster = Cluster(server.url, "alone", tmp_path)
        client = Client.from_url(server.url, prefix="alone")
        seen: list[str] = []
        started = threading.Event()

        def monitor() -> None:  # every command the server runs, until our marker
            with redis.Redis.from_url(server.url).monitor() as m:
                started.set()
                while "qw-test-stop" not in (command := m.next_command()["command"]):
                    seen.append(command)

        try:
            cluster.controller()
            cluster.worker()
            q = client.queue("q")
            assert q.enqueue("tests.handlers:double", {"x": 0}).result(30) == 0
            watcher = threading.Thread(target=monitor, daemon=True)
            watcher.start()
            assert started.wait(5)
            time.sleep(0.3)
            for i in range(12):  # each well after the last, into a read blocked up to 100 ms
                assert q.enqueue("tests.handlers:double", {"x": i}).result(10) == 2 * i
                time.sleep(0.12)
            r.echo("qw-test-stop")
            watcher.join(5)
            sha = Scripts(r)._s["settle_jobs"].sha
            settles = [c for c in seen if c.split()[:2] == ["EVALSHA", sha]]
            assert len(settles) == 12, settles
        finally:
            cluster.close()
            client.close()
            r.close()


@pytest.mark.integration
def test_a_handle_opened_on_a_queue_that_knows_the_handler_enqueues_one_xadd(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """``client.queue(name).enqueue(...)`` once per request: opening the queue reads the
    handlers it was told about, so the job is its ``XADD`` alone, not the handler told again
    with a script (a handle that has not seen the handler still tells it)."""
    client.queue("known").enqueue("tests.handlers:double", {"x": 1})  # (the queue learns it)
    fresh = client.queue("known")
    tk = keys.task("known")
    seen: list[str] = []
    ready, done = threading.Event(), threading.Event()

    def monitor() -> None:
        with r.monitor() as m:
            ready.set()
            for command in m.listen():
                if tk.task_id in command["command"]:
                    seen.append(command["command"].split()[0])
                if done.is_set():
                    return

    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    ready.wait(10)
    fresh.enqueue("tests.handlers:double", {"x": 2})
    other = fresh.enqueue("tests.handlers:job_logged", {"x": 3, "log": f"{tk.task_id}:log"})
    done.set()
    r.ping()
    watcher.join(10)
    assert seen[0] == "XADD", seen  # the known handler's job: its XADD alone
    assert "SADD" in seen[1:], seen  # the new handler is told, with its job
    assert len(r.xrange(tk.stream)) == 3 and other.id
