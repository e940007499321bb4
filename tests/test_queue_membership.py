"""Queues are not gangs: a change of a queue's members (a worker joins, dies, leaves) never
pauses another worker's jobs, and a dead worker's jobs in every queue it read are run again.
Real Redis, real processes, really SIGKILLed."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import redis

from queueworks import Client
from tests.conftest import Cluster, wait_for

TTL = ["--heartbeat-interval", "0.5", "--heartbeat-ttl", "1.5"]


def members_of(client: Client, name: str) -> list[str]:
    return sorted(n.worker for n in client.task(name).status().nodes)


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch of [start, end] without one of ``times`` in it."""
    marks = [start, *sorted(t for t in times if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(marks))


@pytest.mark.system
def test_a_worker_joining_and_dying_never_pauses_the_others_jobs(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """w1 and w2 (--concurrency 2) each run a long job without a safe point and have a slot
    free while fast jobs arrive; w3 joins every queue and is SIGKILLed. Neither w1 nor w2
    stops starting fast jobs meanwhile: their longest gap stays well under the time a drain
    would take (the long jobs' length)."""
    fast = client.queue("fast")
    slow_a, slow_b = client.queue("slow-a"), client.queue("slow-b")
    conc = ["--concurrency", "2", *TTL]
    cluster.worker("w1", extra=[*conc, "--queues", "fast,slow-a"])
    cluster.worker("w2", extra=[*conc, "--queues", "fast,slow-b"])
    wait_for(lambda: members_of(client, "fast") == ["w1", "w2"], 30, "w1, w2 in fast")
    wait_for(lambda: members_of(client, "slow-a") == ["w1"], 30, "w1 in slow-a")
    wait_for(lambda: members_of(client, "slow-b") == ["w2"], 30, "w2 in slow-b")
    long_jobs = [q.enqueue("tests.handlers:sleep_for", {"seconds": 25.0}) for q in (slow_a, slow_b)]
    wait_for(lambda: all(j.status().state == "running" for j in long_jobs), 20, "long jobs")
    log = f"{prefix}:fast-starts"
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            fast.enqueue("tests.handlers:job_logged", {"x": 1, "log": log})
            time.sleep(0.025)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    try:
        time.sleep(1.0)
        start = time.time()
        w3 = cluster.worker("w3", extra=TTL)
        wait_for(lambda: "w3" in members_of(client, "fast"), 30, "w3 in fast")
        time.sleep(1.0)
        w3.kill()
        killed = time.time()
        wait_for(lambda: "w3" not in members_of(client, "fast"), 20, "w3 pruned")
        time.sleep(1.5)
        end = time.time()
    finally:
        stop.set()
        producer.join()
    starts: dict[str, list[float]] = {"w1": [], "w2": [], "w3": []}
    for raw in r.lrange(log, 0, -1):
        _, worker, _, at = raw.decode().split("|")
        starts[worker].append(float(at))
    gaps = {w: round(longest_gap(starts[w], start, end), 2) for w in ("w1", "w2")}
    print("gaps", gaps)
    assert all(g <= 1.0 for g in gaps.values()), (gaps, killed - start, end - start)
    assert all(j.status().state == "running" for j in long_jobs)


@pytest.mark.system
def test_a_dead_workers_jobs_in_every_queue_it_read_run_again_within_a_ttl(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """A worker serving 12 queues keeps no heartbeat per queue (its pool heartbeat is its
    liveness) and records the queues it joined; SIGKILLed while it runs a job of each, every
    one of them runs again on the survivor within the TTL and a little, counted once, whether
    a worker or the controller (which drops it from the pool) finds it dead first."""
    names = [f"m{i:02d}" for i in range(12)]
    queues = [client.queue(n) for n in names]
    cluster.controller()
    victim = cluster.worker("victim", extra=["--concurrency", "12", *TTL])
    wait_for(lambda: all(members_of(client, n) == ["victim"] for n in names), 30, "joined")
    log = f"{prefix}:attempts"
    jobs = [q.enqueue("tests.handlers:slow_first", {"log": log, "seconds": 60}) for q in queues]
    wait_for(lambda: all(j.status().worker == "victim" for j in jobs), 30, "all running")
    cluster.worker("survivor", extra=TTL)
    wait_for(lambda: all(len(members_of(client, n)) == 2 for n in names), 30, "both joined")
    assert {m.decode() for m in r.smembers(f"{prefix}:worker:victim:queues")} == set(names)
    time.sleep(2.0)  # longer than the TTL: a heartbeat per queue would still be there
    assert r.keys(f"{prefix}:task:*:hb:*") == []
    victim.kill()
    killed = time.time()
    assert [j.result(timeout=30) for j in jobs] == [2] * len(jobs)
    rerun = max(j.status().started_at or 0.0 for j in jobs) - killed
    assert rerun < 1.5 + 3.0, rerun  # TTL + a tick, and room for a loaded machine
    for q in queues:
        assert (q.status().done, q.status().dead) == (1, 0)
        assert members_of(client, q.name) == ["survivor"]
    assert not r.exists(f"{prefix}:worker:victim:queues")


@pytest.mark.system
def test_many_idle_queues_cost_a_bounded_number_of_commands(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """200 idle queues, 2 workers: Redis serves a bounded number of commands a second (no
    heartbeat, check or scan per queue at their full rate), a job on any queue still starts
    at once, and a delayed job on a queue with nothing scheduled starts on time."""
    names = [f"idle{i:03d}" for i in range(200)]
    for n in names:
        client.queue(n)
    cluster.worker("a")
    cluster.worker("b")
    total = len(names) * 2

    def joined() -> bool:
        pipe = r.pipeline(transaction=False)
        for n in names:
            pipe.zcard(client.keys.task(n).members)
        return sum(pipe.execute()) == total

    wait_for(joined, 60, "both workers in every queue")
    time.sleep(2.0)  # (the joins' re-ranks settle)
    before, at = int(r.info("stats")["total_commands_processed"]), time.monotonic()
    time.sleep(3.0)
    per_s = (int(r.info("stats")["total_commands_processed"]) - before) / (time.monotonic() - at)
    assert per_s < 3000, per_s  # each of these queues at its full rate: some 6,000 a second
    q = client.queue(names[137])
    started = time.time()
    assert q.enqueue("tests.handlers:double", {"x": 2}).result(timeout=10) == 4
    assert time.time() - started < 2.0
    later = client.queue(names[61]).enqueue("tests.handlers:double", {"x": 3}, delay=1.0)
    assert later.result(timeout=20) == 6
    status = later.status()
    assert status.started_at is not None and status.run_at is not None
    assert status.started_at - status.run_at < 1.5, status.started_at - status.run_at


@pytest.mark.system
def test_a_member_settles_its_jobs_long_after_its_join(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """A queue's member keeps no heartbeat of its own in the queue, yet its settles are
    fenced by its membership: one that joined more than a TTL ago still settles what it runs
    (done, counted, acked), and is still a member."""
    q = client.queue("long_member")
    cluster.worker("w1", extra=TTL)
    wait_for(lambda: members_of(client, "long_member") == ["w1"], 30, "joined")
    time.sleep(2.5)  # past the TTL: the join's key in the queue has run out
    jobs = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(3)]
    assert [j.result(timeout=15) for j in jobs] == [0, 2, 4]
    assert {j.status().worker for j in jobs} == {"w1"}
    assert members_of(client, "long_member") == ["w1"]
