"""Broken promises, reproduced first and then kept: stray entries cannot complete a task or
lose work (completion is by index); a handler's own SystemExit / KeyboardInterrupt /
GeneratorExit is its failed attempt; a worker that may not run a handler refuses the task
instead of poisoning it; the loopback dashboard refuses other Host names (DNS rebinding) and
big bodies before reading them; a submit that dies half-way leaves nothing for good.

Real Redis servers and real processes throughout.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
import redis

from queueworks import Client, TaskSpec, TaskState
from queueworks.client.sync import SUBMIT_LEASE_MS
from queueworks.contrib.redis_server import RedisServer, free_port
from queueworks.protocol.keys import Keys
from queueworks.transport.connection import redact_url
from tests.conftest import Cluster, Proc, wait_for

# -- 1. completion is by index ----------------------------------------------------------------


@pytest.mark.system
def test_stray_entries_and_a_kill_near_the_end_lose_nothing(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """3 workers, 2,000 subtasks of 10 ms; 100 stray entries once 200 are done, a member
    SIGKILLed once 1,850 are: the task completes only with every index settled."""
    cluster.controller()
    workers = [cluster.worker() for _ in range(3)]
    cluster.wait_workers(r, 3)
    n = 2000
    task = client.submit(
        TaskSpec(
            name="stray",
            handler="tests.handlers:double_slow",
            subtasks=({"x": i, "seconds": 0.01} for i in range(n)),
        )
    )
    tk = keys.task(task.id)
    wait_for(lambda: task.status().done >= 200, 60, "200 done")
    pipe = r.pipeline(transaction=False)
    for j in range(100):
        pipe.xadd(tk.stream, {"junk": str(j)})
    pipe.execute()
    wait_for(lambda: task.status().done >= 1850, 60, "1,850 done")
    members = [m.decode() for m in r.zrange(tk.members, 0, -1)]
    victim = next(w for w in workers if w.name in members)
    victim.kill()

    status = task.wait(timeout=60)
    results = dict(task.results())  # read at once: wait() returns only when all are in
    assert status.state == TaskState.COMPLETED, status
    assert (status.done, status.dead, status.rejected) == (n, 0, 100), status
    assert {i: v["y"] for i, v in results.items()} == {i: 2 * i for i in range(n)}
    letters = task.dead_letters(count=10_000)
    assert len(letters) == 100 and {d.reason for d in letters} == {"rejected"}
    # the killed member was pruned and its entries reclaimed, not abandoned
    causes = [f[b"cause"] for _, f in r.xrange(tk.history)]
    assert b"dead" in causes

    # strays after the end change nothing
    for j in range(50):
        r.xadd(tk.stream, {"i": str(j), "p": "{}"})
    time.sleep(1.5)
    after = task.status()
    assert (after.state, after.done, after.dead, after.rejected) == (
        TaskState.COMPLETED,
        n,
        0,
        100,
    )
    assert len(task.dead_letters(count=10_000)) == 100


@pytest.mark.system
def test_an_index_whose_entry_was_deleted_is_dead_lettered_as_lost(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """An entry deleted from the stream before it ran cannot hold the task open forever:
    once nothing is in flight, its index is dead-lettered as ``lost`` and the task ends."""
    cluster.controller()
    task = client.submit(
        TaskSpec(
            name="xdel", handler="tests.handlers:double", subtasks=[{"x": i} for i in range(20)]
        )
    )
    tk = keys.task(task.id)
    entries = r.xrange(tk.stream)
    r.xdel(tk.stream, entries[7][0], entries[13][0])
    cluster.worker()
    status = task.wait(timeout=30)
    assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 18, 2), status
    lost = task.dead_letters()
    assert sorted(d.index for d in lost) == [7, 13]
    assert {d.reason for d in lost} == {"lost"}
    assert set(dict(task.results())) == set(range(20)) - {7, 13}


# -- 2. a handler's exceptions are the handler's ----------------------------------------------


@pytest.mark.system
def test_a_handler_that_raises_systemexit_or_keyboardinterrupt_is_a_failed_attempt(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    worker = cluster.worker()
    cluster.wait_workers(r, 1)
    escapes = {10: "SystemExit", 11: "KeyboardInterrupt", 12: "GeneratorExit"}
    task = client.submit(
        TaskSpec(
            name="escape",
            handler="tests.handlers:escape",
            subtasks=[{"x": i, "raise": escapes.get(i)} for i in range(30)],
            max_attempts=2,
        )
    )
    status = task.wait(timeout=30)
    assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 27, 3), status
    letters = {d.index: d for d in task.dead_letters()}
    assert set(letters) == set(escapes)
    for index, name in escapes.items():
        assert letters[index].attempts == 2 and letters[index].reason == "failed 2 times"
        assert name in letters[index].error, letters[index].error
    assert dict(task.results()) == {i: 2 * i for i in range(30) if i not in escapes}
    # the worker never stopped: one process, registered once, never left the pool
    assert worker.alive()
    kinds = [f[b"kind"] for _, f in r.xrange(keys.events)]
    assert kinds.count(b"worker_joined") == 1 and b"worker_left" not in kinds
    assert '"worker_stopped"' not in worker.log()


@pytest.mark.system
def test_the_workers_own_cold_stop_still_stops_it_and_charges_the_subtask(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """SIGTERM, then the grace period runs out inside a handler with no safe point: the
    worker stops (exit 1), and the interrupted subtask, which did start, is charged."""
    cluster.controller()
    log = f"{prefix}:attempts"
    first = cluster.worker("first", extra=["--grace-period", "1"])
    cluster.wait_workers(r, 1)
    task = client.submit(
        TaskSpec(
            name="cold",
            handler="tests.handlers:slow_first",
            subtasks=[{"log": log, "seconds": 60}],
            max_attempts=3,
        )
    )
    wait_for(lambda: r.llen(log) == 1, 20, "the first attempt to start")
    started = time.monotonic()
    first.signal(signal.SIGTERM)
    assert first.p.wait(15) == 1
    assert time.monotonic() - started < 10
    cluster.worker("second")
    status = task.wait(timeout=30)
    assert (status.done, status.dead) == (1, 0)
    assert dict(task.results()) == {0: 2}  # charged: it ran again as attempt 2
    assert [int(a) for a in r.lrange(log, 0, -1)] == [1, 2]


# -- 3. refuse, don't poison -----------------------------------------------------------------


def _members_ever(r: redis.Redis, keys: Keys, task_id: str) -> set[str]:
    return {
        f[b"worker"].decode()
        for _, f in r.xrange(keys.task(task_id).history)
        if f[b"cause"] == b"join"
    }


@pytest.mark.system
def test_a_worker_that_may_not_run_a_handler_never_poisons_a_task(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Two workers allow the handlers, one was started with another --allow: it is never
    given the tasks, and nothing is dead-lettered."""
    cluster.controller()
    cluster.worker("good-a", allow=("tests.handlers",))
    cluster.worker("good-b", allow=("tests.handlers",))
    cluster.worker("wrong", allow=("myapp",))
    cluster.wait_workers(r, 3)
    tasks = [
        client.submit(
            TaskSpec(
                name=f"t{k}",
                handler="tests.handlers:double",
                subtasks=[{"x": i} for i in range(1000)],
            )
        )
        for k in range(3)
    ]
    for t in tasks:
        status = t.wait(timeout=60)
        assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 1000, 0)
        assert t.dead_letters() == []
        assert "wrong" not in _members_ever(r, keys, t.id)
    record = json.loads(r.hget(keys.worker("wrong"), "record") or b"{}")
    assert record["allow"] == ["myapp"]


@pytest.mark.system
def test_a_worker_that_cannot_import_a_handler_refuses_and_others_run_it(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    broken = cluster.worker("broken", allow=("tests",), env={"QW_TEST_BROKEN_IMPORT": "1"})
    cluster.worker("fine", allow=("tests",))
    cluster.wait_workers(r, 2)  # both may run it: both are given it, "broken" refuses
    task = client.submit(
        TaskSpec(
            name="env",
            handler="tests.handlers_env:triple",
            # slow enough that "broken", given it in the same pass, refuses before the end
            subtasks=[{"x": i, "seconds": 0.05} for i in range(50)],
        )
    )
    wait_for(lambda: r.hexists(keys.task(task.id).refused, "broken"), 15, "the refusal")
    refusal = json.loads(r.hget(keys.task(task.id).refused, "broken") or b"{}")
    assert (
        refusal["kind"] == "unusable" and "lacks what tests.handlers_env needs" in refusal["reason"]
    )
    cluster.worker("fine", allow=("tests",))
    status = task.wait(timeout=30)
    assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 50, 0), status
    assert dict(task.results()) == {i: 3 * i for i in range(50)}
    assert _members_ever(r, keys, task.id) == {"fine"}
    assert broken.alive()


@pytest.mark.system
def test_a_task_no_live_worker_can_run_waits_with_its_reason_then_runs(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, redis_url: str, prefix: str
) -> None:
    cluster.controller()
    cluster.worker("other", allow=("queueworks.examples",))
    cluster.wait_workers(r, 1)
    task = client.submit(
        TaskSpec(
            name="wait", handler="tests.handlers:double", subtasks=[{"x": i} for i in range(5)]
        )
    )
    wait_for(lambda: "may run" in (task.status().reason or ""), 10, "a reason")
    status = task.status()
    assert status.state == TaskState.QUEUED and status.done == status.dead == 0
    assert status.reason == (
        "no live worker may run 'tests.handlers:double': their --allow prefixes are "
        "queueworks.examples"
    )
    info = cluster.spawn(["info"], "info")
    info.p.wait(30)
    assert f"waiting: {status.reason}" in info.log()
    cluster.worker("right", allow=("tests.handlers",))
    status = task.wait(timeout=30)
    assert (status.state, status.done, status.dead) == (TaskState.COMPLETED, 5, 0)
    assert status.reason is None  # cleared once it had its nodes


@pytest.mark.system
def test_a_task_every_eligible_worker_cannot_import_fails_with_the_reason(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker("b1", allow=("tests",), env={"QW_TEST_BROKEN_IMPORT": "1"})
    cluster.worker("b2", allow=("tests",), env={"QW_TEST_BROKEN_IMPORT": "1"})
    cluster.wait_workers(r, 2)
    task = client.submit(
        TaskSpec(name="doomed", handler="tests.handlers_env:triple", subtasks=[{"x": 1}])
    )
    status = task.wait(timeout=30)
    assert status.state == TaskState.FAILED, status
    assert status.error and "lacks what tests.handlers_env needs" in status.error
    assert task.dead_letters() == []


# -- 4. and 5. the dashboard -----------------------------------------------------------------


def _dashboard(cluster: Cluster, *args: str) -> tuple[Proc, int]:
    port = free_port()
    proc = cluster.spawn(["dashboard", "--port", str(port), *args], f"dash-{port}")

    def up() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            return False

    wait_for(up, 20, "the dashboard to listen")
    return proc, port


def _request(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.system
def test_dns_rebinding_is_refused_by_the_tokenless_dashboard(
    cluster: Cluster, client: Client
) -> None:
    task = client.submit(
        TaskSpec(name="keep", handler="tests.handlers:double", subtasks=[{"x": 1}])
    )
    _, port = _dashboard(cluster, "--allowed-host", "dash.internal")
    evil = f"rebind.attacker.example:{port}"
    status, _ = _request(port, "GET", "/api/tasks", {"Host": evil})
    assert status == 400
    status, _ = _request(port, "GET", "/", {"Host": evil})
    assert status == 400
    # the attack: read the CSRF cookie from a page, then post with it from the same "origin"
    status, _ = _request(
        port,
        "POST",
        f"/api/tasks/{task.id}/cancel",
        {
            "Host": evil,
            "Origin": f"http://{evil}",
            "Content-Type": "application/x-www-form-urlencoded",
        },
        b"csrf_token=x",
    )
    assert status == 400
    assert task.status().state == TaskState.QUEUED
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "dash.internal"):
        status, _ = _request(port, "GET", "/api/tasks", {"Host": host})
        assert status == 200, host


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.system
def test_big_bodies_are_refused_before_they_are_read(cluster: Cluster) -> None:
    proc, port = _dashboard(cluster, "--token", "tok-for-body-limits")
    before = _rss_kb(proc.pid)
    # a declared 600 MB: refused at once, with nothing read
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        f"POST /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        "Content-Length: 600000000\r\n\r\n".encode()
    )
    reply = sock.recv(4096)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:100]
    # no declared length (chunked): refused as it streams in, past 64 KiB
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        f"POST /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
    )
    chunk = b"a" * 16384
    reply = b""
    try:
        for _ in range(64):  # up to 1 MiB, unless it answers first
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sock.settimeout(0.05)
            try:
                reply = sock.recv(4096)
            except TimeoutError:
                continue
            if reply:
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    if not reply:
        sock.settimeout(10)
        reply = sock.recv(4096)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413"), reply[:100]
    assert _rss_kb(proc.pid) - before < 20_000  # never held the body


@pytest.mark.system
def test_no_stored_value_makes_a_page_fail(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    task = client.submit(
        TaskSpec(name="deep", handler="tests.handlers:double", subtasks=[{"x": 1}])
    )
    tk = client.keys.task(task.id)
    r.hset(tk.results, "0", "[" * 100_000 + "]" * 100_000)
    r.hset(tk.results, "1", "[" * 200 + "]" * 200)  # valid JSON, too deep to show as a value
    _, port = _dashboard(cluster)
    host = {"Host": f"127.0.0.1:{port}"}
    for path in (f"/tasks/{task.id}", f"/api/tasks/{task.id}"):
        status, body = _request(port, "GET", path, host)
        assert status == 200, (path, body[:300])
    status, body = _request(port, "GET", f"/api/tasks/{task.id}", host)
    shown = {s["index"]: s["result"] for s in json.loads(body)["results"]}
    assert isinstance(shown[0], str) and isinstance(shown[1], str)


@pytest.mark.unit
def test_redact_url_masks_all_userinfo() -> None:
    assert redact_url("redis://:cdLEAK@ME@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("redis://user:p@ss@w@rd@h/0") == "redis://user:***@h/0"
    assert redact_url("rediss://u:pa/ss@h:6380") == "rediss://u:***@h:6380"
    assert redact_url("redis://h:1/0?password=s3@cret") == "redis://h:1/0?password=***"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"


# -- 5. a submit that dies half-way leaves nothing for good ----------------------------------


@pytest.mark.integration
def test_redis_killed_during_submit_leaves_no_orphan(tmp_path: Path, prefix: str) -> None:
    with RedisServer(appendonly=True, appendfsync="always") as server:
        server.start()
        r = server.client()
        keys = Keys(prefix)
        client = Client.from_url(server.url, prefix=prefix)
        failed: list[BaseException] = []

        def submit() -> None:
            try:
                client.submit(
                    TaskSpec(
                        name="big",
                        handler="tests.handlers:double",
                        subtasks=({"x": i} for i in range(400_000)),
                    ),
                    task_id="big",
                )
            except BaseException as exc:
                failed.append(exc)

        thread = threading.Thread(target=submit)
        thread.start()
        tk = keys.task("big")
        wait_for(lambda: r.exists(tk.stream) and r.xlen(tk.stream) > 50_000, 60, "half a submit")
        server.kill()
        thread.join(30)
        assert failed and isinstance(failed[0], redis.ConnectionError | redis.TimeoutError)
        server.start()
        r = server.client()
        assert not r.exists(tk.record)
        left = [k for k in r.scan_iter(match=f"{prefix}:*")]
        assert left, "the AOF kept what the submit wrote"
        for key in left:  # every one of them expires
            ttl = r.pttl(key)
            assert 0 < ttl <= SUBMIT_LEASE_MS, (key, ttl)
        client.close()


@pytest.mark.integration
def test_a_submit_that_finishes_leaves_its_streams_permanent(
    client: Client, r: redis.Redis
) -> None:
    task = client.submit(
        TaskSpec(name="ok", handler="tests.handlers:double", subtasks=[{"x": i} for i in range(5)])
    )
    tk = client.keys.task(task.id)
    assert r.pttl(tk.stream) == -1 and r.pttl(tk.record) == -1


@pytest.mark.integration
@pytest.mark.parametrize("junk", [{"junk": "1"}, {"i": "99", "p": "{}"}])
def test_settle_counts_a_stray_apart_and_never_completes_the_task(
    client: Client, r: redis.Redis, junk: dict[str, str]
) -> None:
    """At the level of the settle script: a stray settled with a result or a dead letter
    is rejected, and done + dead stays below total."""
    task = client.submit(
        TaskSpec(name="s", handler="tests.handlers:double", subtasks=[{"x": i} for i in range(2)])
    )
    tk = client.keys.task(task.id)
    stray = r.xadd(tk.stream, junk).decode()  # type: ignore[arg-type]
    read = r.xreadgroup(tk.group, "w", {tk.stream: ">"}, count=10)
    ids = [e[0].decode() for e in read[0][1]]
    assert ids[-1] == stray
    from queueworks.scripts.bound import DeadEntry

    s = client.scripts.settle(
        tk,
        tk.stream,
        "w",
        time.time(),
        [(ids[0], 0, "0")],
        [DeadEntry(stray, None, "x", "y", 1, "")],
    )
    assert (s.ok, s.dead, s.rejected, s.finished) == (1, 0, 1, False)
    # a second entry claiming index 0 is rejected too; index 1 then completes the task
    dup = r.xadd(tk.stream, {"i": "0", "p": "{}"}).decode()
    r.xreadgroup(tk.group, "w", {tk.stream: ">"}, count=10)
    s = client.scripts.settle(tk, tk.stream, "w", time.time(), [(dup, 0, "9"), (ids[1], 1, "2")])
    assert (s.ok, s.dead, s.rejected, s.finished) == (1, 0, 1, True)
    st = task.status()
    assert (st.state, st.done, st.dead, st.rejected) == (TaskState.COMPLETED, 2, 0, 2)
    assert dict(task.results()) == {0: 0, 1: 2}
