"""Many queues: a worker does not read every queue to find work. It reads the queues that
have jobs (told by the notification of each stream's ``XADD``), so what an idle worker does
does not grow with its queues, a job on any of them starts at once, and a dead worker's job
on one of many queues runs again within the TTL. Real Redis, real processes, SIGKILLed."""

from __future__ import annotations

import random
import socket
import time

import pytest
import redis

from queueworks import Client
from queueworks.workers.queue_scout import FULL_SECONDS, Scout
from queueworks.workers.queue_set import SCOUT_SECONDS
from tests.conftest import Cluster, wait_for

TTL = ["--heartbeat-interval", "0.5", "--heartbeat-ttl", "1.5"]
# where nothing is killed: a loaded machine that starves a heartbeat 1.5 s prunes a live
# worker from every queue, and its rejoins are not what an idle look costs
IDLE_TTL = ["--heartbeat-interval", "1", "--heartbeat-ttl", "8"]


def make_queues(client: Client, names: list[str]) -> None:
    for n in names:
        client.queue(n)


def members_in(r: redis.Redis, client: Client, names: list[str], n: int) -> int:
    """How many of ``names`` have ``n`` members or more."""
    pipe = r.pipeline(transaction=False)
    for name in names:
        pipe.zcard(client.keys.task(name).members)
    return sum(1 for c in pipe.execute() if c >= n)


def monitored(r: redis.Redis, seconds: float) -> list[bytes]:
    """Watch the server (``MONITOR``) for ``seconds``: the commands it ran, a line each."""
    kw = r.connection_pool.connection_kwargs
    sock = socket.create_connection((kw.get("host", "localhost"), kw.get("port", 6379)))
    sock.settimeout(0.2)
    sock.sendall(b"MONITOR\r\n")
    buf = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            continue
        if not chunk:
            break
        buf += chunk
    sock.close()
    return buf.split(b"\r\n")


def streams_per_read(r: redis.Redis, seconds: float) -> list[int]:
    """Watch the server (``MONITOR``) for ``seconds``: how many streams each
    ``XREADGROUP`` named."""
    out = []
    for line in monitored(r, seconds):
        if b'"XREADGROUP"' not in line.upper():
            continue
        words = line.split(b'" "')
        upper = [w.upper() for w in words]
        if b"STREAMS" not in upper:
            continue
        rest = len(words) - upper.index(b"STREAMS") - 1
        out.append(rest // 2)
    return out


def idle_cost(r: redis.Redis, seconds: float) -> tuple[bool, str]:
    """Over ``seconds`` of reads, then ``seconds`` of commands: whether the workers are
    idle as they should be (reads of a few streams, each worker reading every queue once
    at most, a bounded rate), and what was seen."""
    reads = sorted(streams_per_read(r, seconds))
    before, at = int(r.info("stats")["total_commands_processed"]), time.monotonic()
    stats = r.info("commandstats")
    time.sleep(seconds)
    per_s = (int(r.info("stats")["total_commands_processed"]) - before) / (time.monotonic() - at)
    calls = {
        k: v["calls"] - stats.get(k, {}).get("calls", 0) for k, v in r.info("commandstats").items()
    }
    top = sorted(calls.items(), key=lambda kv: -kv[1])[:6]
    # every queue's: 2,000 streams a read; a worker reads every queue once, when it starts
    # to listen, and else a few
    few = bool(reads) and reads[len(reads) // 2] < 100 and sum(n >= 500 for n in reads) <= 2
    return few and per_s < 1500, f"reads {reads[-5:]}, {per_s:.0f} commands/s: {top}"


@pytest.mark.system
def test_two_thousand_idle_queues_are_not_read_each_round(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """2,000 idle queues, 2 workers: no read names every queue's stream (a few, in turn,
    and those told of jobs), Redis serves a bounded number of commands a second, and a job
    on any of the queues starts at once."""
    names = [f"many{i:04d}" for i in range(2000)]
    make_queues(client, names)
    cluster.worker("a", extra=IDLE_TTL)
    cluster.worker("b", extra=IDLE_TTL)
    wait_for(lambda: members_in(r, client, names, 2) == len(names), 120, "both in every queue")
    # after the joins each worker re-ranks and checks every queue once (256 a round): on a
    # loaded machine that takes 30 s and more, and the rate comes and goes meanwhile; then,
    # idle, the workers stay quiet (before, 2,000 queues never settled: thousands of
    # commands a second, memberships pruned and made again)
    seen: list[str] = []

    def quiet() -> bool:
        ok, what = idle_cost(r, 2.0)
        seen.append(what)
        return ok and idle_cost(r, 2.0)[0]  # (and stays so)

    try:
        wait_for(quiet, 150, "2,000 idle queues to cost little")
    except AssertionError as exc:
        raise AssertionError(seen[-3:]) from exc
    rng = random.Random(44)
    waits = []
    for name in rng.sample(names, 10):
        job = client.queue(name).enqueue("tests.handlers:double", {"x": 2})
        assert job.result(timeout=10) == 4
        status = job.status()
        assert status.started_at is not None and status.enqueued_at is not None
        waits.append(status.started_at - status.enqueued_at)
        time.sleep(0.05)
    waits.sort()
    assert waits[len(waits) // 2] < 0.5, waits  # at once: not when a check comes round
    # a prioritised job waits on its priority's stream: its XADD is told too (the backstop
    # alone would come round to a queue once in 2,000 / 50 = 40 s)
    for name in rng.sample(names, 3):
        job = client.queue(name).enqueue("tests.handlers:double", {"x": 5}, priority=3)
        assert job.result(timeout=10) == 10
        status = job.status()
        assert status.started_at is not None and status.enqueued_at is not None
        assert status.started_at - status.enqueued_at < 2.0, (name, status)
    later = client.queue(names[61]).enqueue("tests.handlers:double", {"x": 3}, delay=1.0)
    assert later.result(timeout=20) == 6
    status = later.status()
    assert status.started_at is not None and status.run_at is not None
    assert status.started_at - status.run_at < 1.5, status.started_at - status.run_at


@pytest.mark.system
def test_a_dead_workers_jobs_on_a_few_of_many_queues_run_again_within_a_ttl(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """600 queues, 2 workers; the victim runs a job on each of three of them and is
    SIGKILLed: each runs again on the survivor within the TTL and a little (the queues
    where it left jobs are pruned first, whatever the number of its queues), once."""
    names = [f"dead{i:03d}" for i in range(600)]
    make_queues(client, names)
    cluster.controller()
    victim = cluster.worker("victim", extra=["--concurrency", "3", *TTL])
    wait_for(lambda: members_in(r, client, names, 1) == len(names), 120, "victim joined")
    picked = random.Random(7).sample(names, 3)
    log = f"{prefix}:attempts"
    jobs = [
        client.queue(n).enqueue("tests.handlers:slow_first", {"log": log, "seconds": 60})
        for n in picked
    ]
    wait_for(lambda: all(j.status().worker == "victim" for j in jobs), 30, "all running")
    cluster.worker("survivor", extra=TTL)
    wait_for(lambda: members_in(r, client, names, 2) == len(names), 120, "both joined")
    time.sleep(1.0)
    victim.kill()
    killed = time.time()
    assert [j.result(timeout=60) for j in jobs] == [2] * len(jobs)
    rerun = max(j.status().started_at or 0.0 for j in jobs) - killed
    assert rerun < 1.5 + 3.0, rerun  # TTL + a tick, and room for a loaded machine
    for n in picked:
        status = client.queue(n).status()
        assert (status.done, status.dead) == (1, 0)


@pytest.mark.unit
def test_a_round_takes_the_told_busy_and_poked_queues_and_a_few_in_turn() -> None:
    """``Ready`` alone: of 1,000 queues, a round takes those told of jobs, those busy, the
    poked (at most a round's worth) and a few in turn; a queue read dry is not taken again
    until told, one that brought jobs is."""
    import threading

    from workers.ready import POKES_PER_ROUND, Ready

    wake = threading.Event()
    ready = Ready(wake)
    names = [f"q{i:04d}" for i in range(1000)]
    ready.serve(names)
    ready.listening = True
    assert ready.selective(1000) and not ready.selective(10)
    ready.visited_at = 100.0
    ready.told("q0500")
    assert wake.is_set()
    assert ready.take(100.0) == ["q0500"]  # nothing in turn yet: no time passed
    ready.after("q0500", read=True, brought=False, busy=False)
    assert ready.take(100.0) == []  # read dry: not again until told
    ready.told("q0007")
    ready.take(100.0)
    ready.after("q0007", read=True, brought=True, busy=False)
    ready.after("q0009", read=True, brought=False, busy=True)
    assert ready.take(100.0) == ["q0007", "q0009"]
    flagged = names[600:900]
    for name in flagged:
        ready.flag(name)
    assert ready.flagged(poke=True) == flagged
    taken = ready.take(100.0)
    assert taken == ["q0007", "q0009", *flagged[:POKES_PER_ROUND]]
    in_turn = ready.take(101.0)  # a second later: the rest, and 50 a second in turn
    rest = [n for n in names[:50] if n not in ("q0007", "q0009")]  # (each once a round)
    assert in_turn == ["q0007", "q0009", *flagged[POKES_PER_ROUND:], *rest]


@pytest.mark.unit
def test_a_set_of_queues_that_held_thousands_and_holds_few_is_made_anew() -> None:
    """Every queue told (a reconnect) and every one poked: once read dry, the sets that
    held them are made anew at their size, so a round does not walk 10,000 empty slots
    (a set or dict keeps its table when entries go)."""
    import sys
    import threading

    from workers.ready import Ready

    ready = Ready(threading.Event())
    names = [f"q{i:05d}" for i in range(10_000)]
    ready.serve(names)
    ready.visited_at = 100.0
    ready.told(None)
    for name in names:
        ready.poke(name)
    assert len(ready.take(100.0)) == 10_000
    for name in names:
        ready.after(name, read=True, brought=name == "q00042", busy=name == "q00007")
    while ready.poked:
        ready.take(100.0)
    ready.told("q00500")
    assert ready.take(100.0) == ["q00042", "q00500", "q00007"]
    small = {"q00042", "q00500"}
    assert sys.getsizeof(ready.hot) == sys.getsizeof(small)
    assert sys.getsizeof(ready.busy) == sys.getsizeof({"q00007"})
    assert sys.getsizeof(ready.poked) == sys.getsizeof({})


@pytest.mark.integration
def test_the_scouts_backstop_reads_every_queue_in_turn_a_few_at_each_look(
    client: Client, r: redis.Redis
) -> None:
    """The scout reads every queue at its first look, then, as the backstop for a missed
    event, a few queues at each look, in turn: every one again within ``FULL_SECONDS``
    (a queue cancelled with no event is seen), never all of them at once (thousands of
    commands in one burst with thousands of queues, every worker's at the same time)."""
    names = [f"scout{i:03d}" for i in range(300)]
    make_queues(client, names)
    scout = Scout(r, client.keys, labels={}, allow=["tests"])
    t = 1000.0  # (the scout's clock: monotonic seconds, given)
    assert sorted(scout.eligible(t)) == names
    r.hset(client.keys.task(names[7]).record, "state", "cancelled")  # (and no event)
    looks = int(2 * FULL_SECONDS / SCOUT_SECONDS) + 2  # two backstop periods, and a look
    read = []
    for k in range(1, looks + 1):
        before = r.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0)
        served = scout.eligible(t + k * SCOUT_SECONDS)
        read.append(r.info("commandstats")["cmdstat_hmget"]["calls"] - before)
    assert sorted(served) == names[:7] + names[8:]
    share = len(names) / FULL_SECONDS * SCOUT_SECONDS  # 5 a look
    assert len(names) <= sum(read) <= len(names) + 2 * share, read  # (a round, a period after)
    assert max(read) <= share + 1, read
