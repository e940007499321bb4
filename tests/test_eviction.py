"""Redis must not evict: a worker and a controller refuse to start on a Redis whose
``maxmemory-policy`` may evict (one line naming it) unless told otherwise; the client raises
on its first write, checked once; a policy nobody may read is one warning; a running
process says when the policy changes. Private redis-servers of the tests' own (the shared
one is never reconfigured)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from structlog.testing import capture_logs

from queueworks import AsyncClient, Client, EvictingRedis, TaskSpec
from queueworks.contrib.redis_server import RedisServer
from queueworks.protocol.keys import Keys
from tests.cluster_fixtures import LocalCluster
from tests.conftest import Cluster, Proc, wait_for

EVICTING = ["--maxmemory-policy", "allkeys-lru", "--maxmemory", "200mb"]
LIMITED = "limited"  # a user whose ACL forbids CONFIG and INFO


@pytest.fixture(scope="module")
def evicting() -> Iterator[RedisServer]:
    with RedisServer(extra_args=EVICTING) as server:
        yield server


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A noeviction server this test may reconfigure."""
    with RedisServer() as server:
        yield server


def events_of(log: str) -> list[dict[str, object]]:
    out = []
    for line in log.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


@pytest.mark.system
def test_worker_and_controller_refuse_an_evicting_redis(
    evicting: RedisServer, prefix: str, tmp_path: Path
) -> None:
    procs = Cluster(evicting.url, prefix, tmp_path)
    try:
        worker = procs.worker("w-evict")
        controller = procs.controller("c-evict")
        for proc in (worker, controller):
            assert proc.p.wait(20) == 1, proc.log()
            log = proc.log()
            assert "Traceback" not in log, log
            lines = [line for line in log.splitlines() if "maxmemory-policy" in line]
            assert len(lines) == 1, log
            assert lines[0].startswith("error: Redis at 127.0.0.1:"), lines
            assert "maxmemory-policy allkeys-lru" in lines[0]
            assert "--allow-eviction" in lines[0]
        r = evicting.client()
        assert r.zcard(Keys(prefix).workers) == 0  # the worker never registered
        assert not r.exists(Keys(prefix).leader)  # nor did the controller lead
    finally:
        procs.close()


@pytest.mark.system
def test_with_the_override_they_start_and_run_jobs(
    evicting: RedisServer, prefix: str, tmp_path: Path
) -> None:
    procs = Cluster(evicting.url, prefix, tmp_path)
    try:
        procs.controller("c-allowed", extra=["--allow-eviction"])
        worker = procs.worker("w-allowed", env={"QUEUEWORKS_ALLOW_EVICTION": "1"})
        r = evicting.client()
        procs.wait_workers(r, 1)
        with Client.from_url(evicting.url, prefix=prefix, allow_eviction=True) as client:
            q = client.queue("allowed")
            assert q.enqueue("tests.handlers:double", {"x": 21}).result(timeout=30) == 42
        warned = [e for e in events_of(worker.log()) if e["event"] == "redis_evicting"]
        assert len(warned) == 1 and warned[0]["policy"] == "allkeys-lru", worker.log()
        assert warned[0]["level"] == "warning" and warned[0]["allowed"] is True
    finally:
        procs.close()


@pytest.mark.integration
def test_the_clients_first_write_raises(evicting: RedisServer, prefix: str) -> None:
    r = evicting.client()
    with Client.from_url(evicting.url, prefix=prefix) as client:
        assert client.tasks() == []  # reading is fine
        for write in (
            lambda: client.queue("q"),
            lambda: client.submit(TaskSpec(name="t", handler="tests.handlers:double", subtasks=[])),
            lambda: client.task("t1").cancel(),
            lambda: client.drain_worker("w1"),
        ):
            with pytest.raises(EvictingRedis, match="maxmemory-policy allkeys-lru") as raised:
                write()
            assert raised.value.policy == "allkeys-lru"
            assert "allow_eviction=True" in str(raised.value)
        assert r.keys(f"{prefix}*") == []  # nothing was written

    async def main() -> None:
        async with AsyncClient.from_url(evicting.url, prefix=prefix) as aclient:
            with pytest.raises(EvictingRedis, match="maxmemory-policy allkeys-lru"):
                await aclient.queue("q")
            with pytest.raises(EvictingRedis):
                await aclient.submit(TaskSpec(name="t", handler="tests.handlers:double"))
            with pytest.raises(EvictingRedis):
                await aclient.task("t1").cancel()
        async with AsyncClient.from_url(evicting.url, prefix=prefix, allow_eviction=True) as ok:
            q = await ok.queue("q")
            await q.enqueue("tests.handlers:double", {"x": 1})

    asyncio.run(main())
    assert r.xlen(Keys(prefix).task("q").stream) == 1  # the allowed client wrote


def config_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats").get("cmdstat_config|get", {})
    return int(stats.get("calls", 0))


@pytest.mark.integration
def test_the_client_reads_the_policy_once(own_redis: RedisServer, prefix: str) -> None:
    r = own_redis.client()
    before = config_calls(r)
    with Client.from_url(own_redis.url, prefix=prefix) as client:
        q = client.queue("once")
        for i in range(50):
            q.enqueue("tests.handlers:double", {"x": i})
        client.submit(TaskSpec(name="t", handler="tests.handlers:double", subtasks=[{"x": 1}]))
    assert config_calls(r) - before == 1

    async def main() -> None:
        async with AsyncClient.from_url(own_redis.url, prefix=prefix) as aclient:
            aq = await aclient.queue("once")
            jobs = [aq.enqueue("tests.handlers:double", {"x": i}) for i in range(50)]
            await asyncio.gather(*jobs)

    asyncio.run(main())
    assert config_calls(r) - before == 2


def limited_url(server: RedisServer) -> str:
    server.client().acl_setuser(
        LIMITED,
        enabled=True,
        passwords=["+secret-pw"],
        keys=["*"],
        channels=["*"],
        commands=["+@all", "-config", "-info"],
    )
    return f"redis://{LIMITED}:secret-pw@127.0.0.1:{server.port}/0"


@pytest.mark.system
def test_a_policy_nobody_may_read_is_one_warning(
    own_redis: RedisServer, prefix: str, tmp_path: Path
) -> None:
    url = limited_url(own_redis)
    with pytest.raises(redis.exceptions.NoPermissionError):
        redis.Redis.from_url(url).config_get("maxmemory-policy")
    with capture_logs() as logs, Client.from_url(url, prefix=prefix) as client:
        q = client.queue("acl")
        q.enqueue("tests.handlers:double", {"x": 1})
        client.queue("acl").enqueue("tests.handlers:double", {"x": 2})
    unknown = [e for e in logs if e["event"] == "redis_policy_unknown"]
    assert len(unknown) == 1 and unknown[0]["log_level"] == "warning", logs
    assert "secret-pw" not in repr(logs)
    procs = Cluster(url, prefix, tmp_path)
    try:
        worker = procs.worker("w-acl")
        procs.controller("c-acl")
        procs.wait_workers(own_redis.client(), 1)
        assert q.job(q.enqueue("tests.handlers:double", {"x": 4}).id).result(timeout=30) == 8
        events = events_of(worker.log())
        unknown_events = [e for e in events if e["event"] == "redis_policy_unknown"]
        assert len(unknown_events) == 1, worker.log()
        assert "secret-pw" not in worker.log()
    finally:
        procs.close()


@pytest.mark.system
def test_a_running_worker_and_controller_say_when_the_policy_changes(
    own_redis: RedisServer, prefix: str, tmp_path: Path
) -> None:
    procs = Cluster(own_redis.url, prefix, tmp_path)
    fast = {"QUEUEWORKS_POLICY_CHECK_INTERVAL": "0.2"}
    try:
        worker = procs.worker("w-watch", env=fast)
        controller = procs.spawn(["controller"], "c-watch", env=fast)
        r = own_redis.client()
        procs.wait_workers(r, 1)
        wait_for(lambda: r.exists(Keys(prefix).leader), 15, "a leader")

        def said(proc: Proc, event: str) -> list[dict[str, object]]:
            return [e for e in events_of(proc.log()) if e["event"] == event]

        assert not said(worker, "redis_evicting")
        r.config_set("maxmemory-policy", "volatile-lru")
        for proc in (worker, controller):
            wait_for(lambda p=proc: said(p, "redis_evicting"), 15, f"{proc.name} to say so")
        r.config_set("maxmemory-policy", "noeviction")
        for proc in (worker, controller):
            wait_for(lambda p=proc: said(p, "redis_noeviction"), 15, f"{proc.name} to say so")
            got = said(proc, "redis_evicting")
            assert len(got) == 1, proc.log()  # once per change, not once per read
            assert got[0]["level"] == "error" and got[0]["policy"] == "volatile-lru"
    finally:
        procs.close()


@pytest.mark.system
def test_on_a_cluster_every_primary_is_read(prefix: str, tmp_path: Path) -> None:
    """One primary of two evicting is enough: the client raises, naming that node, and a
    worker refuses to start."""
    with LocalCluster(2) as lc:
        second = lc.nodes[1]
        second.client().config_set("maxmemory-policy", "volatile-ttl")
        with Client.from_url(lc.url, prefix=prefix) as client:
            with pytest.raises(EvictingRedis, match="volatile-ttl") as raised:
                client.queue("q")
            assert raised.value.node == f"127.0.0.1:{second.port}"

        async def main() -> None:
            async with AsyncClient.from_url(lc.url, prefix=prefix) as aclient:
                with pytest.raises(EvictingRedis, match="volatile-ttl"):
                    await aclient.queue("q")

        asyncio.run(main())
        procs = Cluster(lc.url, prefix, tmp_path)
        try:
            worker = procs.worker("w-cluster")
            assert worker.p.wait(20) == 1, worker.log()
            assert "maxmemory-policy volatile-ttl" in worker.log()
        finally:
            procs.close()
        second.client().config_set("maxmemory-policy", "noeviction")
        with Client.from_url(lc.url, prefix=prefix) as client:
            client.queue("q")  # every primary noeviction: it writes
