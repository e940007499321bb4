"""What a queue leaves in Redis once it has finished: nothing that outlives its
``result_ttl``. Its per-job keys (the records of jobs that never finished, a deferred job's
dependencies, unique keys held by unfinished jobs) are named by no list of the queue's keys:
the leader finds them through what the queue indexes and gives them the queue's expiry."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import redis

from queueworks import Client
from queueworks.controller import leftovers
from queueworks.controller.feed import Feed
from queueworks.controller.leftovers import Leftovers
from queueworks.controller.reconciler import Reconciler
from queueworks.logs import get_logger
from queueworks.protocol.jobrecords import JobEntry, decode_entry
from queueworks.protocol.keys import GROUP, Keys
from queueworks.protocol.models import JobState
from queueworks.queue import job_keys
from queueworks.scripts.bound import JobBatch, Scripts
from tests.conftest import Cluster, wait_for
from tests.test_flow import _leader

TTL = 4.0  # s: the queues' result_ttl
TTL_ROUNDING_MS = 20  # how much later than the queue a copied expiry may come
DOUBLE = "queueworks.examples:double"


def queue_keys(r: redis.Redis, keys: Keys, name: str) -> dict[str, int]:
    """Every key of queue ``name`` (a SCAN: fine in a test, never in the code) with its
    PTTL (ms; -1: no expiry; a key gone between the scan and the look is left out)."""
    found = sorted(r.scan_iter(match=f"{keys.prefix}:task:{{{name}}}*", count=1000))
    pipe = r.pipeline(transaction=False)
    for key in found:
        pipe.pttl(key)
    return {k.decode(): ttl for k, ttl in zip(found, pipe.execute(), strict=True) if ttl != -2}


def outliving(r: redis.Redis, keys: Keys, name: str) -> dict[str, int]:
    """The keys of ``name`` that would outlive its result_ttl: no expiry, or a longer one."""
    return {k: t for k, t in queue_keys(r, keys, name).items() if t == -1 or t > TTL * 1000}


@pytest.mark.system
@pytest.mark.slow(10)
def test_a_finished_queue_leaves_nothing_past_its_result_ttl(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    controller = cluster.controller()
    worker = cluster.worker(extra=["--concurrency", "4"])  # runs a job beside the hung one
    cluster.wait_workers(r, 1)
    left = client.queue("left", result_ttl=TTL, group_limit=1)
    fin = client.queue("fin", result_ttl=TTL, max_attempts=1)

    # a queue whose jobs all finish: done, dead, unique, and one that waited for another
    first = fin.enqueue(DOUBLE, {"x": 1}, key="once")
    after = fin.enqueue(DOUBLE, {"x": 2}, depends_on=[first])
    dead = fin.enqueue("tests.handlers:always_fails", {})
    assert first.result(timeout=30) == 2 and after.result(timeout=30) == 4
    wait_for(lambda: dead.status().state == JobState.DEAD, 30, "the failing job dead")

    # a queue left with a job in every unfinished state: running (holding its group's slot,
    # its worker killed), waiting for that slot, set aside (no worker may run its handler),
    # queued, unique, delayed, deferred
    running = left.enqueue("tests.handlers:hang", {}, group="g")
    waiting = left.enqueue(DOUBLE, {"x": 3}, group="g")
    aside = left.enqueue("os:system", "true")
    wait_for(lambda: running.status().state == JobState.RUNNING, 30, "the hanging job running")
    wait_for(lambda: waiting.status().reason, 30, "a job waiting for its group's slot")
    wait_for(lambda: aside.status().reason, 30, "a job set aside")
    worker.kill()
    queued = left.enqueue(DOUBLE, {"x": 4})
    unique = left.enqueue(DOUBLE, {"x": 5}, key="u-queued")
    delayed = left.enqueue(DOUBLE, {"x": 6}, delay=3600, key="u-delayed")
    deferred = left.enqueue(DOUBLE, {"x": 7}, depends_on=[running, delayed], key="u-deferred")
    assert deferred.status().state == JobState.DEFERRED
    assert delayed.status().state == JobState.SCHEDULED
    assert {queued.status().state, unique.status().state} == {JobState.QUEUED}
    lk = keys.task("left")
    per_job = [
        lk.job(waiting.id),
        lk.job(aside.id),
        lk.job(delayed.id),
        lk.job(deferred.id),
        lk.deps(deferred.id),
        *(lk.unique(k) for k in ("u-queued", "u-delayed", "u-deferred")),
    ]
    assert r.exists(*per_job) == len(per_job)

    assert left.task.cancel() and fin.task.cancel()
    for name in ("left", "fin"):  # the leader releases it: its record expires
        record = keys.task(name).record
        wait_for(lambda k=record: r.pttl(k) > 0, 30, f"{name} released")
    for name in ("left", "fin"):  # the leader gives its other keys the same expiry
        settled_by = time.monotonic() + 3
        while outliving(r, keys, name) and time.monotonic() < settled_by:
            time.sleep(0.05)
        assert outliving(r, keys, name) == {}
    ttls = [r.pttl(k) for k in per_job]  # expiring (or gone already, on a slow machine)
    assert all(t == -2 or 0 < t <= TTL * 1000 for t in ttls), dict(zip(per_job, ttls, strict=True))
    wait_for(lambda: "leftovers_expiring" in controller.log(), 10, "the leader's walk logged")
    deadline = time.monotonic() + 3 * TTL
    for name in ("left", "fin"):
        wait_for(
            lambda n=name: not queue_keys(r, keys, n),
            max(1.0, deadline - time.monotonic()),
            f"{name}'s keys gone",
        )
    # and no global index names them for long: the controller forgets a queue whose keys
    # are gone (and has walked it), and no job waits for them
    named = ["left", "fin"]

    def forgotten() -> bool:
        pipe = r.pipeline(transaction=False)
        pipe.smismember(keys.queues, named)
        pipe.smismember(keys.dep_tasks, named)
        pipe.zmscore(keys.tasks, named)
        pipe.zmscore(keys.tasks_expiry, named)
        pipe.zmscore(keys.queues_expiring, named)
        queues, dep_tasks, *scores = pipe.execute()
        return not any(queues) and not any(dep_tasks) and all(s == [None, None] for s in scores)

    wait_for(forgotten, 30, "the global indexes forgetting the queues")


def _walk(r: redis.Redis, keys: Keys, rec: Reconciler, feed: Feed) -> Leftovers:
    """The leader's release of what ended (in this process), and its walks' first pass."""
    walks = Leftovers(r, keys, Scripts(r), rec.fence, get_logger(), rec.tally, lambda: True)
    rec.step(feed.read(100))
    walks.step(True)
    return walks


@pytest.mark.integration
def test_the_walk_goes_in_batches_and_a_reopen_keeps_the_jobs(
    client: Client, r: redis.Redis, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_keys, "BATCH", 2)  # every source takes several batches
    monkeypatch.setattr(leftovers, "TRIPS", 1)  # and a walk several passes
    q = client.queue("again", result_ttl=60, group_limit=1)
    qk, scripts = keys.task("again"), Scripts(r)
    rec, feed = _leader(r, keys)
    grouped = [q.enqueue(DOUBLE, {"x": i}, group="g") for i in range(4)]
    r.xreadgroup(GROUP, "w1", {qk.stream: ">"})
    took = [scripts.group_take(qk, qk.stream, j.id, "w1", j.id, "g", 1, 0, False) for j in grouped]
    assert took == [1, 0, 0, 0]  # one holds the slot (running), three wait for it
    assert grouped[1].cancel()  # cancelled where it waits: it keeps its place on the list
    queued = [q.enqueue(DOUBLE, {"x": i}, key=f"q{i}") for i in range(5)]
    delayed = [q.enqueue(DOUBLE, {"x": i}, delay=3600, key=f"d{i}") for i in range(3)]
    deferred = [q.enqueue(DOUBLE, {"x": i}, depends_on=delayed[:2]) for i in range(3)]
    unfinished = [
        *(qk.job(j.id) for j in (*grouped[2:], *delayed, *deferred)),
        *(qk.deps(j.id) for j in deferred),
        *(qk.unique(f"q{i}") for i in range(5)),
        *(qk.unique(f"d{i}") for i in range(3)),
    ]
    assert r.exists(*unfinished) == len(unfinished)
    assert all(r.pttl(k) == -1 for k in unfinished)
    cancelled_ttl = r.pttl(qk.job(grouped[1].id))
    assert cancelled_ttl > 0

    # released: a pass walks one round trip (TRIPS), so the walk takes many
    assert q.task.cancel()
    walks = _walk(r, keys, rec, feed)
    assert r.zscore(keys.queues_expiring, "again") is not None
    for _ in range(3):
        walks.step(False)
    walks.reset()  # a new leader (or term) takes the walk up again from the index
    passes = 1
    while walks.walks or passes == 1:
        walks.step(False)
        passes += 1
    assert passes > 10
    assert all(0 < r.pttl(k) <= 60_000 for k in unfinished)
    assert r.zscore(keys.queues_expiring, "again") is None  # walked: out of the index

    # reopened: the jobs are the queue's again, and kept; the cancelled one still expires
    q = client.queue("again", reopen=True)
    assert all(r.pttl(k) == -1 for k in unfinished)
    assert 0 < r.pttl(qk.job(grouped[1].id)) <= cancelled_ttl
    assert {j.status().state for j in queued} == {JobState.QUEUED}
    assert {j.status().state for j in delayed} == {JobState.SCHEDULED}
    assert {j.status().state for j in deferred} == {JobState.DEFERRED}

    # finished again, and reopened in the middle of the leader's walk: the batches walked
    # before are kept again by the reopen, those after find the queue active and stop it
    assert q.task.cancel()
    walks = _walk(r, keys, rec, feed)
    for _ in range(4):
        walks.step(False)
    assert walks.walks and any(r.pttl(k) > 0 for k in unfinished)
    q = client.queue("again", reopen=True)
    while walks.walks:
        walks.step(False)
    assert all(r.pttl(k) == -1 for k in unfinished)
    assert r.zscore(keys.queues_expiring, "again") is None


@dataclass(frozen=True)
class Failed:
    """A failed attempt, as a member settles it (``script_calls.SettledJob``)."""

    entry: JobEntry
    started_at: float
    attempt: int = 1
    outcome: str = "boom"
    reason: str = ""


@pytest.mark.integration
def test_what_is_written_after_the_release_expires_with_the_queue(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("late", result_ttl=60)
    qk, scripts = keys.task("late"), Scripts(r)
    rec, feed = _leader(r, keys)
    aside, retried = q.enqueue(DOUBLE, {"x": 1}), q.enqueue(DOUBLE, {"x": 2})
    buried = q.enqueue(DOUBLE, {"x": 0})
    r.xreadgroup(GROUP, "w1", {qk.stream: ">"})  # a member runs all three, one dies
    fields = r.xrange(qk.stream, buried.id, buried.id)[0][1]
    dead = Failed(decode_entry(buried.id, fields), time.time(), reason="failed 1 times")
    scripts.settle_jobs(qk, JobBatch(dead=[dead]), "w1", time.time(), 60, client=None)
    dead_letter = r.xrange(qk.dead)[0][0].decode()
    assert q.task.cancel()
    _walk(r, keys, rec, feed)
    assert 0 < r.pttl(qk.record) <= 60_000
    # the member goes on: one job it may not run is set aside, the other fails and waits
    # for a retry; an operator's requeue of the dead job, begun before the cancel, ends;
    # a handle kept by a client enqueues more
    assert scripts.requeue_job(qk, dead_letter, buried.id, time.time())[0] == 1
    assert scripts.set_aside(qk, aside.id, aside.id, "w1", "os:system", "not allowed", 1)
    fields = r.xrange(qk.stream, retried.id, retried.id)[0][1]
    failed = Failed(decode_entry(retried.id, fields), time.time())
    now = time.time()
    assert scripts.retry_later(qk, [(failed, now + 3600, "tb")], "w1", now, None)[0] == 1
    delayed = q.enqueue(DOUBLE, {"x": 3}, delay=3600)
    held = q.enqueue(DOUBLE, {"x": 4}, delay=3600, key="held")
    deferred = q.enqueue(DOUBLE, {"x": 5}, depends_on=[delayed])
    unique_deferred = q.enqueue(DOUBLE, {"x": 6}, depends_on=[delayed], key="waits")
    q.enqueue(DOUBLE, {"x": 7}, key="now")
    written = [
        qk.aside_stream("os:system"),
        *(qk.job(j.id) for j in (aside, retried, buried, delayed, held, deferred, unique_deferred)),
        *(qk.deps(j.id) for j in (deferred, unique_deferred)),
        *(qk.unique(k) for k in ("held", "waits", "now")),
    ]
    # each script copies the queue's TTL as PTTL then PEXPIRE, to the millisecond: a copy
    # of a copy may land a millisecond or two later (a loaded server's script runs longer)
    ttl = r.pttl(qk.record) + TTL_ROUNDING_MS
    assert {k: r.pttl(k) for k in written if not 0 < r.pttl(k) <= ttl} == {}
