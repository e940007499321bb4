"""The queue's fast paths (issue 18, Performance): ``enqueue_many`` pipelined from a thread
of its own, and a member's settle sent as a bare EVALSHA with its read (no SCRIPT EXISTS
round trip), healed when Redis has lost its scripts. Real Redis, real processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from queueworks import Client
from queueworks.keys import Keys
from queueworks.queues import ENQUEUE_BATCH, ENQUEUE_PIPELINE
from queueworks.redis_server import RedisServer
from tests import handlers
from tests.conftest import Cluster, wait_for

PER_PIPELINE = ENQUEUE_BATCH * ENQUEUE_PIPELINE


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
    assert [fields[b"j"].decode() for _, fields in entries] == [job.id for job in jobs]
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
                with pytest.raises(Exception, match="failed 1 times"):
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
