"""Unique jobs: ``q.enqueue(..., key=K, unique_for=S)`` makes no second job while one holding
``K`` is scheduled, queued or running (or finished less than ``S`` s ago): it returns that
one. Atomic (one Lua step), released by the job's final outcome (done, dead, cancelled),
never by another job's, and never held for ever by a job that vanished. Real Redis; a member
played by hand where a test settles a job it holds, real workers where one runs it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client, JobFailed
from queueworks.protocol.jobrecords import JobEntry, decode_entry
from queueworks.protocol.keys import Keys, TaskKeys
from queueworks.protocol.models import JobState
from queueworks.scripts.bound import JobBatch
from tests.conftest import Cluster, wait_for

NOOP = "tests.handlers:double"
MEMBER = "member-m"


@dataclass
class Settling:
    """A job a member (played by hand) settles: what ``settle_jobs`` reads of it."""

    entry: JobEntry
    started_at: float
    attempt: int
    outcome: str
    reason: str = ""


def settle_next(client: Client, r: redis.Redis, tk: TaskKeys, *, dead: bool = False) -> str:
    """Read the next entry of the queue as a member would, and settle it done (or dead);
    the job's id."""
    read: Any = r.xreadgroup(tk.group, MEMBER, {tk.stream: ">"}, count=1)
    entry_id, fields = read[0][1][0]
    entry = decode_entry(entry_id.decode(), fields)
    job = Settling(entry, time.time(), 1, "boom" if dead else "2", "failed 1 times")
    batch = JobBatch(ok=[] if dead else [job], dead=[job] if dead else [])
    client.scripts.settle_jobs(tk, batch, MEMBER, time.time(), 600, client=None)
    return entry.job_id


@pytest.mark.integration
def test_a_key_held_by_a_waiting_job_returns_that_job(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("inv")
    tk = keys.task("inv")
    first = q.enqueue(NOOP, {"x": 1}, key="invoice-42")
    again = q.enqueue("tests.handlers:square", {"x": 2}, key="invoice-42")
    other = q.enqueue(NOOP, {"x": 3}, key="invoice-43")
    plain = q.enqueue(NOOP, {"x": 4})
    assert (first.created, again.created, other.created, plain.created) == (True, False, True, True)
    assert again.id == first.id and other.id != first.id
    entries: Any = r.xrange(tk.stream)
    assert [e.decode() for e, _ in entries] == [first.id, other.id, plain.id]  # one each
    assert entries[0][1][b"o"] == b'{"key":"invoice-42"}'
    assert r.get(tk.unique("invoice-42")) == first.id.encode()
    assert r.ttl(tk.unique("invoice-42")) == -1  # held while live: no expiry

    later = q.enqueue(NOOP, {"x": 5}, key="later", delay=60)
    assert later.status().state == JobState.SCHEDULED
    twice = q.enqueue(NOOP, {"x": 6}, key="later")  # to run now, but the key is held
    assert (twice.id, twice.created) == (later.id, False)
    assert r.zcard(tk.scheduled) == 1 and r.xlen(tk.stream) == 3


@pytest.mark.integration
def test_done_or_dead_frees_the_key_or_holds_it_unique_for(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("release")
    tk = keys.task("release")
    first = q.enqueue(NOOP, {"x": 1}, key="k")
    q.enqueue(NOOP, {"x": 1}, key="k")
    assert settle_next(client, r, tk) == first.id
    assert first.result(timeout=5) == 2 and not r.exists(tk.unique("k"))
    second = q.enqueue(NOOP, {"x": 1}, key="k")
    assert second.created and second.id != first.id

    assert settle_next(client, r, tk, dead=True) == second.id
    with pytest.raises(JobFailed):
        second.result(timeout=5)
    third = q.enqueue(NOOP, {"x": 1}, key="k", unique_for=1)
    assert third.created

    assert settle_next(client, r, tk) == third.id
    assert 0 < r.pttl(tk.unique("k")) <= 1000
    within = q.enqueue(NOOP, {"x": 1}, key="k", unique_for=1)
    assert (within.id, within.created) == (third.id, False)  # done, but within its window
    wait_for(lambda: not r.exists(tk.unique("k")), 10, "the unique_for window to close")
    after = q.enqueue(NOOP, {"x": 1}, key="k")
    assert after.created and after.id != third.id


@pytest.mark.integration
def test_a_settle_never_releases_the_key_of_another_job_and_counts_once(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("others")
    tk = keys.task("others")
    first = q.enqueue(NOOP, {"x": 1}, key="k")
    read: Any = r.xreadgroup(tk.group, MEMBER, {tk.stream: ">"}, count=1)
    r.set(tk.unique("k"), "someone-else")  # the key moved on (an index flushed and taken)
    entry = decode_entry(read[0][1][0][0].decode(), read[0][1][0][1])
    job = Settling(entry, time.time(), 1, "2")
    done = client.scripts.settle_jobs(tk, JobBatch(ok=[job]), MEMBER, time.time(), 60, None)
    assert list(done) == [1, 0, 0, 0] and first.result(timeout=5) == 2
    assert r.get(tk.unique("k")) == b"someone-else"

    r.set(tk.unique("k"), first.id)  # a late ack of the same job: changes nothing
    again = client.scripts.settle_jobs(tk, JobBatch(ok=[job]), MEMBER, time.time(), 60, None)
    assert list(again) == [0, 0, 0, 0] and r.get(tk.unique("k")) == first.id.encode()


@pytest.mark.integration
def test_cancel_frees_the_key_and_unique_for_holds_it(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("cancels")
    tk = keys.task("cancels")
    now = q.enqueue(NOOP, {"x": 1}, key="now")
    later = q.enqueue(NOOP, {"x": 1}, key="later", delay=60)
    held = q.enqueue(NOOP, {"x": 1}, key="held", unique_for=60)
    assert now.cancel() and later.cancel() and held.cancel()
    assert not r.exists(tk.unique("now")) and not r.exists(tk.unique("later"))
    assert 0 < r.ttl(tk.unique("held")) <= 60
    assert q.enqueue(NOOP, {"x": 1}, key="now").created
    assert q.enqueue(NOOP, {"x": 1}, key="later").created
    found = q.enqueue(NOOP, {"x": 1}, key="held")
    assert (found.id, found.created) == (held.id, False)
    with pytest.raises(JobFailed, match="cancelled"):
        found.result(timeout=1)


@pytest.mark.integration
def test_a_key_is_held_through_a_retry_and_back_on_the_stream(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """A job waiting for its retry waits off the stream (a record in state scheduled, in
    the scheduled zset), then comes back as an entry naming it: it holds its key all along
    (the second case reads its record: one round trip more)."""
    q = client.queue("retries")
    tk = keys.task("retries")
    job = q.enqueue(NOOP, {"x": 1}, key="k")
    options = r.xrange(tk.stream)[0][1][b"o"]
    r.xdel(tk.stream, job.id)  # it failed: off the stream until its retry is due
    r.hset(tk.job(job.id), mapping={"s": "scheduled", "h": NOOP, "p": '{"x": 1}', "o": options})
    r.hset(tk.job(job.id), mapping={"t": repr(time.time()), "at": repr(time.time())})
    r.zadd(tk.scheduled, {job.id: time.time()})
    assert q.enqueue(NOOP, {"x": 1}, key="k").id == job.id
    assert client.scripts.promote_due(tk, [job.id]) == 1  # due: an entry naming it
    assert job.status().state == JobState.QUEUED
    found = q.enqueue(NOOP, {"x": 1}, key="k")
    assert (found.id, found.created) == (job.id, False)
    assert settle_next(client, r, tk) == job.id  # done: the named job's key is free
    assert q.enqueue(NOOP, {"x": 1}, key="k").created


@pytest.mark.integration
def test_a_key_left_by_a_vanished_job_is_taken(client: Client, r: redis.Redis, keys: Keys) -> None:
    q = client.queue("stale")
    tk = keys.task("stale")
    now = q.enqueue(NOOP, {"x": 1}, key="now")
    later = q.enqueue(NOOP, {"x": 1}, key="later", delay=60)
    r.xdel(tk.stream, now.id)  # entries and records lost, their indexes left behind
    r.delete(tk.job(later.id))
    r.zrem(tk.scheduled, later.id)
    for key, gone in (("now", now), ("later", later)):
        taken = q.enqueue(NOOP, {"x": 2}, key=key)
        assert taken.created and taken.id != gone.id
        assert r.get(tk.unique(key)) == taken.id.encode()
    finished = q.enqueue(NOOP, {"x": 3}, key="done-but-indexed", delay=60)
    r.zrem(tk.scheduled, finished.id)
    r.hset(tk.job(finished.id), "s", "done")  # finished, its index not released
    assert q.enqueue(NOOP, {"x": 3}, key="done-but-indexed").created


@pytest.mark.integration
def test_a_delayed_job_whose_record_is_gone_holds_its_key_no_longer(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Its id left in the scheduled zset proves nothing: the record is the job. The next
    enqueue of the key takes it, and the id left behind is dropped when it comes due."""
    q = client.queue("stale-delayed")
    tk = keys.task("stale-delayed")
    gone = q.enqueue(NOOP, {"x": 1}, key="k", delay=3600)
    held = q.enqueue(NOOP, {"x": 2}, key="k")
    assert (held.id, held.created) == (gone.id, False)  # while its record is there: held
    r.delete(tk.job(gone.id))  # the record deleted; its id stays in the scheduled zset
    with pytest.raises(LookupError):
        gone.status()
    taken = q.enqueue(NOOP, {"x": 3}, key="k")
    assert taken.created and taken.id != gone.id
    assert taken.status().state == JobState.QUEUED
    assert r.get(tk.unique("k")) == taken.id.encode()
    assert client.scripts.promote_due(tk, [gone.id]) == 0  # due: nothing to run
    assert q.enqueue(NOOP, {"x": 4}, key="k").id == taken.id


@pytest.mark.integration
@pytest.mark.parametrize("round_", range(4))
def test_ten_clients_racing_on_one_key_make_one_job(
    redis_url: str, prefix: str, r: redis.Redis, keys: Keys, round_: int
) -> None:
    clients = [Client.from_url(redis_url, prefix=prefix) for _ in range(10)]
    queues = [c.queue("race") for c in clients]
    barrier = threading.Barrier(10)
    got: list[Any] = [None] * 10
    key = f"race-{round_}"

    def enqueue(i: int) -> None:
        barrier.wait(10)
        got[i] = queues[i].enqueue(NOOP, {"x": i}, key=key, delay=None if i % 2 else 0.0)

    threads = [threading.Thread(target=enqueue, args=(i,)) for i in range(10)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for c in clients:
            c.close()
    assert all(job is not None for job in got)
    assert len({job.id for job in got}) == 1
    assert sum(job.created for job in got) == 1
    assert r.xlen(keys.task("race").stream) == 1


@pytest.mark.integration
def test_the_async_client_makes_one_job_per_key(
    redis_url: str, prefix: str, r: redis.Redis, keys: Keys
) -> None:
    async def main() -> None:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            q = await ac.queue("aunique")
            jobs = await asyncio.gather(*(q.enqueue(NOOP, {"x": i}, key="a") for i in range(10)))
            assert len({j.id for j in jobs}) == 1 and sum(j.created for j in jobs) == 1
            plain = await q.enqueue(NOOP, {"x": 1})
            assert plain.created and plain.id != jobs[0].id
            assert await jobs[3].cancel() is True
            again = await q.enqueue(NOOP, {"x": 1}, key="a", unique_for=5)
            assert again.created and again.id != jobs[0].id
            with pytest.raises(ValueError, match="unique_for"):
                await q.enqueue(NOOP, {"x": 1}, key="a", unique_for=-1)

    asyncio.run(main())
    assert r.xlen(keys.task("aunique").stream) == 2


@pytest.mark.integration
@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"key": ""}, "key must be a non-empty string"),
        ({"key": 42}, "key must be a non-empty string"),
        ({"key": "k" * 300}, "key is too long"),
        ({"key": "a\tb"}, "control character"),
        ({"unique_for": 5}, "unique_for needs a key"),
        ({"key": "k", "unique_for": float("nan")}, "unique_for"),
    ],
)
def test_bad_keys_are_refused_naming_them_and_write_nothing(
    client: Client, r: redis.Redis, keys: Keys, given: dict[str, Any], named: str
) -> None:
    q = client.queue("bad")
    with pytest.raises(ValueError, match=named):
        q.enqueue(NOOP, {"x": 1}, **given)
    assert r.xlen(keys.task("bad").stream) == 0


@pytest.mark.system
def test_real_workers_free_the_key_when_the_job_is_done_or_dead(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("workers", max_attempts=1)
    tk = keys.task("workers")
    ok = q.enqueue(NOOP, {"x": 4}, key="ok")
    failing = q.enqueue("tests.handlers:always_fails", {"x": 1}, key="bad")
    cluster.worker()
    assert ok.result(timeout=60) == 8
    with pytest.raises(JobFailed, match="failed 1 time: "):
        failing.result(timeout=60)
    wait_for(lambda: not r.exists(tk.unique("ok"), tk.unique("bad")), 10, "keys released")
    again = q.enqueue(NOOP, {"x": 5}, key="ok", unique_for=60)
    assert again.created and again.result(timeout=60) == 10
    wait_for(lambda: r.ttl(tk.unique("ok")) > 0, 10, "the key held unique_for")
    assert q.enqueue(NOOP, {"x": 6}, key="ok").id == again.id
    assert q.enqueue("tests.handlers:always_fails", {}, key="bad").created


@pytest.mark.system
def test_the_cli_enqueues_with_a_key_once(redis_url: str, prefix: str, r: redis.Redis) -> None:
    def enqueue(*args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "QUEUEWORKS_REDIS_URL": redis_url, "QUEUEWORKS_PREFIX": prefix}
        command = [sys.executable, "-m", "queueworks", "enqueue", "cliq", NOOP, *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    made = enqueue("--json", '{"x": 1}', "--key", "inv-1", "--unique-for", "30")
    found = enqueue("--json", '{"x": 2}', "--key", "inv-1")
    assert made.returncode == found.returncode == 0, (made.stderr, found.stderr)
    assert made.stdout == found.stdout and made.stderr == ""
    assert f"job {made.stdout.strip()} holds key 'inv-1'" in found.stderr
    assert r.xlen(Keys(prefix).task("cliq").stream) == 1
    for args, says in (
        (["--unique-for", "5"], "--unique-for needs --key"),
        (["--key", "a\nb"], "control character"),
        (["--key", "k", "--unique-for", "0"], "--unique-for"),
    ):
        bad = enqueue(*args)
        assert bad.returncode != 0 and says in bad.stderr, bad.stderr


@pytest.mark.integration
def test_a_deferred_job_holds_its_key_until_its_dependency_dies(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("deferred-keys")
    tk = keys.task("deferred-keys")
    first = q.enqueue(NOOP, {"x": 1})  # no worker: it waits
    dependent = q.enqueue(NOOP, {"x": 2}, key="k", depends_on=[first])
    assert dependent.created and dependent.status().state == JobState.DEFERRED
    again = q.enqueue(NOOP, {"x": 3}, key="k", depends_on=[first])
    assert (again.id, again.created) == (dependent.id, False)  # deferred: it holds the key
    assert r.get(tk.unique("k")) == dependent.id.encode()
    assert first.cancel() is True  # the dependency is cancelled: the dependent dies...
    wait_for(lambda: dependent.status().state == JobState.DEAD, 10, "the dependent to die")
    wait_for(lambda: not r.exists(tk.unique("k")), 10, "its key to be freed")
    after = q.enqueue(NOOP, {"x": 4}, key="k")  # ...and its key is free
    assert after.created and after.id != dependent.id
