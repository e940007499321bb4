"""Every number and name is checked where it enters, so no stored value can crash a worker;
and a worker that meets a bad stored value anyway (an older version wrote it, or a person)
keeps working. A queue handle carries its settings: after Redis lost the queue it creates
it again with them. A client whose Redis is down says so in one line.

Real Redis servers and real processes throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from queueworks import (
    AsyncClient,
    Client,
    JobState,
    QueueNotFound,
    RedisUnavailable,
    SubmitError,
    TaskSpec,
    TaskState,
)
from queueworks.contrib.redis_server import RedisServer, free_port
from queueworks.protocol.keys import Keys
from queueworks.protocol.messages import MAX_DEPTH
from queueworks.protocol.models import StoredSpec
from queueworks.queue.queue_settings import QueueSettings
from tests.conftest import ROOT, Cluster, wait_for
from tests.test_asyncio_client import run


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# -- numbers and names where they enter --------------------------------------------------------

BAD_DELAYS: list[tuple[dict[str, Any], str]] = [
    ({"delay": math.inf}, "delay"),
    ({"delay": 1e308}, "delay"),
    ({"delay": math.nan}, "delay"),
    ({"delay": -1.0}, "delay"),
    ({"delay": True}, "delay"),
    ({"delay": "5"}, "delay"),
    ({"at": math.nan}, "at"),
    ({"at": math.inf}, "at"),
    ({"at": 1e308}, "at"),
    ({"at": "tomorrow"}, "at"),
    ({"at": datetime.now() + timedelta(days=365 * 20)}, "at"),
]

BAD_SETTINGS: list[tuple[dict[str, Any], str]] = [
    ({"wait_timeout": math.nan}, "wait_timeout"),
    ({"wait_timeout": None}, "wait_timeout"),
    ({"job_timeout": math.nan}, "job_timeout"),
    ({"job_timeout": 0}, "job_timeout"),
    ({"job_timeout": 1e308}, "job_timeout"),
    ({"result_ttl": math.inf}, "result_ttl"),
    ({"priority": 10**30}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"min_nodes": True}, "min_nodes"),
    ({"min_nodes": "2"}, "min_nodes"),
    ({"min_nodes": 0}, "min_nodes"),
    ({"max_nodes": 0}, "max_nodes"),
    ({"max_nodes": 10**12}, "max_nodes"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"node_selector": {"gpu": 1}}, "node_selector"),
    ({"min_nodes": 3, "max_nodes": 2}, "max_nodes"),
]

BAD_NAMES = ["q\n", "q\r", ".", "..", "-q", "_q", "", "a" * 65, "a b", "a/b", "a{b}", "é"]
GOOD_NAMES = ["a", "Q", "emails", "a.b-c_d", "0", "a" * 64, "v1.2"]


@pytest.mark.integration
def test_bad_numbers_are_refused_where_they_enter(client: Client, r: redis.Redis) -> None:
    """``delay``/``at`` of ``enqueue`` and every queue setting: a ``ValueError`` naming the
    field, and nothing written."""
    q = client.queue("nums")
    before = sorted(r.scan_iter(match=f"{client.keys.prefix}:*"))
    for kwargs, field in BAD_DELAYS:
        with pytest.raises(ValueError, match=field):
            q.enqueue("tests.handlers:double", {"x": 1}, **kwargs)
    for kwargs, field in BAD_SETTINGS:
        with pytest.raises(ValueError, match=field):
            client.queue(f"bad-{field}", **kwargs)
    assert sorted(r.scan_iter(match=f"{client.keys.prefix}:*")) == before
    # good values still go: a delay of 0 runs now, one of a year is scheduled
    assert q.enqueue("tests.handlers:double", {"x": 1}, delay=0).status().state == JobState.QUEUED
    later = q.enqueue("tests.handlers:double", {"x": 1}, delay=365 * 86400.0)
    assert later.status().state == JobState.SCHEDULED
    fine = client.queue("fine", result_ttl=0.5, priority=-5, max_nodes=None)
    assert fine.settings.result_ttl == 0.5
    with pytest.raises(TypeError, match="idle_after"):  # no setting any more
        client.queue("idle", idle_after=30.0)  # type: ignore[typeddict-unknown-key]


@pytest.mark.integration
def test_bad_numbers_are_refused_by_the_async_client_alike(redis_url: str, prefix: str) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            q = await ac.queue("nums")
            for kwargs, field in BAD_DELAYS:
                with pytest.raises(ValueError, match=field):
                    await q.enqueue("tests.handlers:double", {"x": 1}, **kwargs)
            for kwargs, field in BAD_SETTINGS:
                with pytest.raises(ValueError, match=field):
                    await ac.queue(f"bad-{field}", **kwargs)
            for name in BAD_NAMES:
                with pytest.raises(ValueError, match="must match"):
                    await ac.queue(name)
                with pytest.raises(ValueError, match="must match"):
                    ac.task(name)
            with pytest.raises(ValueError, match="payload"):
                await q.enqueue("tests.handlers:double", nested(5000))
            with pytest.raises(ValueError, match="payload"):
                await q.enqueue_many([("tests.handlers:double", nested(MAX_DEPTH + 1))])
            assert await ac.redis.exists(ac.keys.task("bad-delay").record) == 0

    run(main)


@pytest.mark.integration
def test_task_and_queue_names_follow_one_pattern(client: Client, r: redis.Redis) -> None:
    """One pattern, anchored at the very end: no trailing newline, no "." or "..", no name
    that looks like a flag."""
    for name in BAD_NAMES:
        with pytest.raises(ValueError, match="must match"):
            client.queue(name)
        with pytest.raises(ValueError, match="must match"):
            client.task(name)
        with pytest.raises(ValueError, match="must match"):
            client.submit(TaskSpec(name="n", handler="m:f", subtasks=[1]), task_id=name or "-")
    assert not [k for k in r.scan_iter(match=f"{client.keys.prefix}:*") if b"\n" in k]
    for name in GOOD_NAMES:
        assert client.queue(name).name == name
    for prefix in ["qw\n", "", "a b", "-x", "x" * 33]:
        with pytest.raises(ValueError, match="prefix"):
            Client.from_url("redis://127.0.0.1:1/0", prefix=prefix)
        with pytest.raises(ValueError, match="prefix"):
            AsyncClient.from_url("redis://127.0.0.1:1/0", prefix=prefix)


@pytest.mark.integration
def test_a_deep_payload_is_a_clear_error(client: Client) -> None:
    """Not a RecursionError: a ``ValueError`` naming the payload (or the subtask), at any
    depth past the bound; the bound itself is fine."""
    q = client.queue("deep")
    for depth in (5000, MAX_DEPTH + 1):
        with pytest.raises(ValueError, match=f"payload.*{MAX_DEPTH}"):
            q.enqueue("tests.handlers:double", nested(depth))
        with pytest.raises(ValueError, match="payload"):
            q.enqueue_many([("tests.handlers:double", nested(depth))])
        with pytest.raises(SubmitError, match=r"subtasks\[1\]"):
            client.submit(TaskSpec(name="d", handler="m:f", subtasks=[1, nested(depth)]))
        with pytest.raises(ValueError, match="payload"):
            q.enqueue("tests.handlers:double", {"k": [{"a": nested(depth)}]}, delay=5)
    assert q.enqueue("tests.handlers:double", nested(MAX_DEPTH)).id
    deep_text = {"s": "[" * 5000 + "{" * 5000}  # brackets in strings are no nesting
    assert q.enqueue("tests.handlers:double", deep_text).id
    assert q.status().backlog == 2


@pytest.mark.unit
def test_task_specs_refuse_values_no_worker_could_use() -> None:
    base: dict[str, Any] = {"name": "t", "handler": "m:f"}
    for bad, field in [
        ({"priority": 10**30}, "priority"),
        ({"min_nodes": 10**12}, "min_nodes"),
        ({"subtask_timeout": math.inf}, "subtask_timeout"),
        ({"result_ttl": math.nan}, "result_ttl"),
        ({"max_dead": 10**30}, "max_dead"),
        ({"options": {"x": {"y": [1.0, math.nan]}}}, "options.x.y"),
        ({"options": {"torch": {"collective_timeout": math.inf}}}, "options.torch"),
    ]:
        with pytest.raises(ValueError, match=field):
            TaskSpec(**base, **bad)
    # a spec read back from Redis is not refused for a bad option: its readers use the default
    stored = TaskSpec(name="q", mode="queue").model_dump(mode="json")
    stored["options"] = {"queue": {"wait_timeout": None, "idle_after": None}}
    spec = StoredSpec.model_validate_json(json.dumps(stored))
    assert QueueSettings.of(spec).wait_timeout == 1.0


@pytest.mark.integration
def test_changes_of_priority_and_bounds_are_checked(client: Client) -> None:
    q = client.queue("change")
    for bad in (10**30, 1.5, True, "3"):
        with pytest.raises(ValueError, match="priority"):
            q.task.set_priority(bad)  # type: ignore[arg-type]
    for low, high in ((0, 2), (1.5, 2), (2, 1), (1, 10**12), (True, 2)):
        with pytest.raises(ValueError, match=r"min_nodes|max_nodes"):
            q.task.resize(low, high)  # type: ignore[arg-type]
    q.task.set_priority(7)
    q.task.resize(1, 3)
    status = q.status()
    assert (status.priority, status.min_nodes, status.max_nodes) == (7, 1, 3)


# -- a worker never crashes on a stored value ---------------------------------------------------


@pytest.mark.system
def test_bad_stored_values_crash_no_worker(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """What an older version (or a person) wrote straight into Redis: a queue whose stored
    options hold an ``idle_after`` of null, delayed jobs due at ``inf`` and at 1e308, a job
    enqueued at ``-inf``, a payload nested 5,000 deep. The queue's worker serves it
    regardless: the bad job is dead-lettered with its reason, the good ones run, the worker
    stays up."""
    q = client.queue("stored", job_timeout=10.0)
    tk = keys.task("stored")
    spec = json.loads(r.hget(tk.record, "spec") or b"")
    spec["options"] = {"queue": {"idle_after": None}}
    r.hset(tk.record, "spec", json.dumps(spec))
    r.zadd(tk.scheduled, {"a" * 20: math.inf, "b" * 20: 1e308})
    deep = "[" * 5000 + "]" * 5000
    r.xadd(tk.stream, {"h": "tests.handlers:double", "p": deep, "t": repr(time.time())})
    r.xadd(tk.stream, {"h": "tests.handlers:double", "p": '{"x": 4}', "t": "-inf"})
    cluster.controller()
    worker = cluster.worker()
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=30) == 2
    wait_for(lambda: q.status().done == 2, 30, "the job enqueued at -inf done")
    wait_for(lambda: q.status().rejected + q.status().dead == 1, 30, "the deep one dead-lettered")
    letter = q.task.dead_letters()[0]
    assert f"deeper than {MAX_DEPTH}" in letter.reason + letter.error, letter
    time.sleep(1.5)  # the leader's duties (due jobs) ran a few times since
    assert worker.alive(), worker.log()[-3000:]
    assert q.enqueue("tests.handlers:double", {"x": 5}).result(timeout=30) == 10
    assert "Traceback" not in worker.log(), worker.log()[-3000:]


# -- a kept queue handle after Redis lost its keys --------------------------------------------


@pytest.fixture
def lonely() -> Iterator[RedisServer]:
    """A private server of the test's own (it is restarted empty: no AOF, no RDB)."""
    with RedisServer() as server:
        server.start()
        yield server


def restarted(server: RedisServer, client: Client) -> None:
    """Restart the server empty; the client's pooled connections reconnect."""
    server.restart()
    client.redis.connection_pool.disconnect()


async def restarted_async(server: RedisServer, client: AsyncClient) -> None:
    server.restart()
    await client.redis.connection_pool.disconnect()


SETTINGS = {"max_attempts": 5, "job_timeout": 7.0, "priority": 3, "wait_timeout": 2.5}


def stored_settings(r: redis.Redis, keys: Keys, name: str) -> QueueSettings:
    raw = r.hget(keys.task(name).record, "spec")
    assert raw is not None, f"queue {name} has no record"
    return QueueSettings.of(StoredSpec.model_validate_json(raw))


@pytest.mark.system
def test_a_kept_handle_creates_its_queue_again_after_redis_restarted_empty(
    lonely: RedisServer, prefix: str, tmp_path: Path
) -> None:
    client = Client.from_url(lonely.url, prefix=prefix)
    r, keys = lonely.client(), Keys(prefix)
    q = client.queue("mail", **SETTINGS)
    q.enqueue("tests.handlers:double", {"x": 1})  # its handler is known to the handle now
    old = q.enqueue("tests.handlers:double", {"x": 2}, delay=60)
    restarted(lonely, client)

    job = q.enqueue("tests.handlers:double", {"x": 3})  # the one-XADD path
    assert stored_settings(r, keys, "mail") == q.settings
    assert job.status().state == JobState.QUEUED
    assert r.sismember(keys.task("mail").handlers, "tests.handlers:double")
    with pytest.raises(LookupError, match="no job"):
        old.status()  # lost with the restart: said so, not a ResponseError
    with pytest.raises(LookupError, match="no job"):
        old.cancel()

    restarted(lonely, client)
    assert q.status().backlog == 0  # the queue is there again, empty
    assert stored_settings(r, keys, "mail") == q.settings
    restarted(lonely, client)
    later = q.enqueue("tests.handlers:double", {"x": 4}, delay=0.5)  # the Lua path
    assert stored_settings(r, keys, "mail") == q.settings
    assert later.status().state == JobState.SCHEDULED
    restarted(lonely, client)
    jobs = q.enqueue_many([("tests.handlers:double", {"x": i}) for i in range(5, 8)])
    assert stored_settings(r, keys, "mail") == q.settings

    cluster = Cluster(lonely.url, prefix, tmp_path)
    try:
        cluster.controller()
        cluster.worker()
        assert [j.result(timeout=30) for j in jobs] == [10, 12, 14]
    finally:
        cluster.close()
    client.close()


@pytest.mark.system
def test_a_kept_handle_finds_jobs_an_older_client_left_without_a_group(
    lonely: RedisServer, prefix: str, tmp_path: Path
) -> None:
    """An entry written after the restart by a client that only XADDs (as every version
    before did): no group, no record. Its status and result create the queue again, and it
    runs."""
    client = Client.from_url(lonely.url, prefix=prefix)
    r, keys = lonely.client(), Keys(prefix)
    q = client.queue("orphans", **SETTINGS)
    restarted(lonely, client)
    tk = keys.task("orphans")
    entry = r.xadd(tk.stream, {"h": "tests.handlers:double", "p": '{"x": 21}', "t": "1"})
    job = q.job(entry.decode())
    assert job.status().state == JobState.QUEUED  # not "NOGROUP No such key"
    assert stored_settings(r, keys, "orphans") == q.settings
    restarted(lonely, client)
    entry = r.xadd(tk.stream, {"h": "tests.handlers:double", "p": '{"x": 22}', "t": "1"})
    cluster = Cluster(lonely.url, prefix, tmp_path)
    try:
        cluster.controller()
        cluster.worker()
        assert q.job(entry.decode()).result(timeout=30) == 44
    finally:
        cluster.close()
    assert q.job(entry.decode()).cancel() is False
    client.close()


@pytest.mark.integration
def test_a_cancelled_queue_is_not_created_again_by_a_kept_handle(
    lonely: RedisServer, prefix: str
) -> None:
    client = Client.from_url(lonely.url, prefix=prefix)
    r, keys = lonely.client(), Keys(prefix)
    q = client.queue("gone", **SETTINGS)
    assert q.task.cancel()
    r.delete(keys.task("gone").stream)  # its keys expire one by one: the stream first
    with pytest.raises(QueueNotFound, match="cancelled"):
        q.enqueue("tests.handlers:double", {"x": 1})
    assert r.hget(keys.task("gone").record, "state") == b"cancelled"
    assert not r.exists(keys.task("gone").stream)
    listed = Client.from_url(lonely.url, prefix=prefix)
    r.delete(keys.task("gone").record)
    assert listed.queues() == []  # a listing never creates a queue again
    assert not r.exists(keys.task("gone").record)
    client.close()
    listed.close()


@pytest.mark.system
def test_a_kept_async_handle_creates_its_queue_again_alike(
    lonely: RedisServer, prefix: str, tmp_path: Path
) -> None:
    r, keys = lonely.client(), Keys(prefix)

    async def main() -> None:
        async with AsyncClient.from_url(lonely.url, prefix=prefix) as ac:
            q = await ac.queue("amail", **SETTINGS)
            await q.enqueue("tests.handlers:double", {"x": 1})
            old = await q.enqueue("tests.handlers:double", {"x": 2}, delay=60)
            await restarted_async(lonely, ac)
            job = await q.enqueue("tests.handlers:double", {"x": 3})
            assert stored_settings(r, keys, "amail") == q.settings
            assert (await job.status()).state == JobState.QUEUED
            with pytest.raises(LookupError, match="no job"):
                await old.status()
            with pytest.raises(LookupError, match="no job"):
                await old.cancel()
            await restarted_async(lonely, ac)
            assert (await q.status()).backlog == 0
            await restarted_async(lonely, ac)
            many = await asyncio.gather(
                *(q.enqueue("tests.handlers:double", {"x": i}) for i in range(4, 8))
            )
            assert stored_settings(r, keys, "amail") == q.settings
            await restarted_async(lonely, ac)
            tk = keys.task("amail")
            entry = r.xadd(tk.stream, {"h": "tests.handlers:double", "p": '{"x": 9}', "t": "1"})
            orphan = q.job(entry.decode())
            assert (await orphan.status()).state == JobState.QUEUED
            cluster = Cluster(lonely.url, prefix, tmp_path)
            try:
                cluster.controller()
                cluster.worker()
                assert await orphan.result(timeout=30) == 18
            finally:
                cluster.close()
            del many
            await ac.redis.delete(tk.record)
            assert await ac.queues() == []
            assert not r.exists(tk.record)

    run(main)


# -- first use ---------------------------------------------------------------------------------


@pytest.mark.system
def test_a_worker_imports_handlers_from_the_folder_it_started_in(
    cluster: Cluster, client: Client, r: redis.Redis, tmp_path: Path
) -> None:
    """``queueworks worker --allow myjobs`` in the folder of myjobs.py finds it (as rq and
    celery workers do); the allowlist still applies."""
    module = f"myjobs_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text("def triple(payload):\n    return payload['x'] * 3\n")
    (tmp_path / "other_jobs.py").write_text("def triple(payload):\n    return 0\n")
    script = Path(sys.executable).with_name("queueworks")
    assert script.exists(), script
    log = (tmp_path / "w.log").open("wb")
    worker = subprocess.Popen(
        [str(script), "worker", "--allow", module],
        cwd=tmp_path,
        env={**cluster.env, "PYTHONPATH": str(ROOT)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        cluster.controller()
        cluster.wait_workers(r, 1)
        q = client.queue("first")
        assert q.enqueue(f"{module}:triple", {"x": 5}).result(timeout=30) == 15
        task = client.submit(TaskSpec(name="t", handler="other_jobs:triple", subtasks=[{"x": 1}]))
        wait_for(lambda: "no live worker may run" in (task.status().reason or ""), 30, "reason")
    finally:
        worker.terminate()
        worker.wait(20)
        log.close()


@pytest.mark.system
def test_a_failed_tasks_reason_is_its_status_reason_and_in_info(
    cluster: Cluster, client: Client, r: redis.Redis, redis_url: str, prefix: str
) -> None:
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    spec = TaskSpec(
        name="f", handler="tests.handlers:always_fails", subtasks=[{}], max_attempts=1, max_dead=0
    )
    status = client.submit(spec).wait(timeout=30)
    assert status.state == TaskState.FAILED and status.error, status
    assert status.reason == status.error
    shown = subprocess.run(
        [sys.executable, "-m", "queueworks", "info"],
        env={**cluster.env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert f"failed: {status.error}" in shown, shown

    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            assert (await ac.task(status.id).status()).reason == status.error

    run(main)


@pytest.mark.integration
def test_a_client_whose_redis_is_down_raises_one_clear_error(prefix: str) -> None:
    port = free_port()
    url = f"redis://user:s3cret@127.0.0.1:{port}/0"
    shown = f"redis://user:***@127.0.0.1:{port}/0"
    client = Client.from_url(url, prefix=prefix)  # no I/O yet
    for call in (lambda: client.queue("x"), client.tasks, lambda: client.task("t").status()):
        with pytest.raises(RedisUnavailable) as down:
            call()
        assert isinstance(down.value, redis.ConnectionError)
        text = str(down.value)
        assert text.startswith(f"cannot reach Redis at {shown}: "), text
        assert "s3cret" not in text and "\n" not in text and "refused" in text
        assert down.value.__suppress_context__ and down.value.__cause__ is None

    async def main() -> None:
        ac = AsyncClient.from_url(url, prefix=prefix)
        with pytest.raises(RedisUnavailable) as down:
            await ac.queue("x")
        text = str(down.value)
        assert text.startswith(f"cannot reach Redis at {shown}: ") and "s3cret" not in text
        assert down.value.__suppress_context__ and down.value.__cause__ is None
        await ac.close()

    run(main)
    with contextlib.suppress(Exception):
        client.close()
