"""Timeouts hold whatever a handler does: a coroutine that swallows its cancellation still
loses its slot at ``job_timeout``, charged, and holds no rebalance; a coroutine that blocks
the event loop is logged, charged past its own timeout, and charges nobody else; a loop
blocked past the hard limit exits its worker, the others' jobs handed back uncharged.
Real worker processes at ``--concurrency``, a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from queue import SimpleQueue

import pytest
import redis
import structlog
from structlog.testing import capture_logs

from queueworks import Client, Job, JobFailed, Queue, TaskSpec
from queueworks.workers.eventloop import Call, EventLoop
from queueworks.workers.inflight import InFlight
from queueworks.workers.watchdog import EXIT_HUNG, TimedOut, Watchdog
from tests.conftest import Cluster, Proc, wait_for


def concurrent(n: int) -> list[str]:
    return ["--concurrency", str(n)]


def warm(q: Queue, nodes: int) -> None:
    """A job done, and every worker in the queue's node set."""
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=30) == 2
    wait_for(lambda: len(q.status().nodes) == nodes, 15, f"{nodes} members")


def in_flight(
    cluster: Cluster, client: Client, r: redis.Redis, name: str, timeout: float, n: int, s: float
) -> tuple[Proc, Queue, str, list[Job]]:
    """One worker at --concurrency 10 in the queue ``name`` (job_timeout ``timeout``, one
    attempt), with ``n`` async jobs of ``s`` seconds in flight on it: (worker, queue, the
    hash that counts their runs, the jobs)."""
    cluster.controller()
    worker = cluster.worker(name, extra=concurrent(10))
    cluster.wait_workers(r, 1)
    q = client.queue(name, job_timeout=timeout, max_attempts=1)
    warm(q, 1)
    runs = f"{cluster.prefix}:runs"
    jobs = [
        q.enqueue("tests.handlers:async_counted", {"x": i, "seconds": s, "runs": runs})
        for i in range(n)
    ]
    wait_for(lambda: r.hlen(runs) == n, 20, f"the {n} jobs in flight")
    return worker, q, runs, jobs


def events(proc: Proc, name: str) -> list[dict[str, object]]:
    out = []
    for line in proc.log().splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            event = json.loads(line)
            if event["event"] == name:
                out.append(event)
    return out


@pytest.mark.system
def test_uncancellable_coroutines_lose_their_slot_at_the_timeout_and_hold_no_rebalance(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """2 coroutines that swallow their cancellation among 200 jobs, on 2 workers x 10: the 2
    are dead (timed out) at job_timeout, not done with their own value; a third worker
    joins while they run, held no longer than their deadline; no innocent job runs twice
    or is charged."""
    cluster.controller()
    cluster.worker("a", extra=concurrent(10))
    cluster.worker("b", extra=concurrent(10))
    cluster.wait_workers(r, 2)
    q = client.queue("stubborn", job_timeout=3.0, max_attempts=1)
    warm(q, 2)
    runs = f"{prefix}:runs"
    stubborn = [
        q.enqueue("tests.handlers:async_stubborn", {"seconds": 40, "runs": runs}) for _ in range(2)
    ]
    wait_for(lambda: r.hlen(runs) == 2, 20, "both stubborn coroutines running")
    innocent = [
        q.enqueue("tests.handlers:async_counted", {"x": i, "seconds": 0.3, "runs": runs})
        for i in range(200)
    ]
    joined = time.monotonic()
    cluster.worker("c", extra=concurrent(10))  # joins while the 2 run: a rebalance
    wait_for(lambda: len(q.status().nodes) == 3, 20, "the third worker in the node set")
    assert time.monotonic() - joined < 15  # held at most to their deadline, not their 40 s
    for job in stubborn:
        with pytest.raises(JobFailed) as failed:
            job.result(timeout=20)
        assert "timed out: it ran past job_timeout (3.0 s)" in failed.value.traceback
        assert job.status().state == "dead"
    assert [j.result(timeout=60) for j in innocent] == [2 * i for i in range(200)]
    counts = {k.decode(): int(v) for k, v in r.hgetall(runs).items()}
    assert all(counts[j.id] == 1 for j in innocent), {j.id: counts[j.id] for j in innocent}
    assert {j.status().attempts for j in innocent} == {1}
    status = q.status()
    assert (status.done, status.dead) == (201, 2)


@pytest.mark.system
def test_one_at_a_time_an_uncancellable_coroutine_frees_its_worker_at_the_timeout(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    """At --concurrency 1 the worker waits for a coroutine only until its deadline: a
    queue's job and a task's subtask that swallow their cancellation fail, timed out, and
    what follows runs at once (not after their 30 s)."""
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    runs = f"{prefix}:runs"
    q = client.queue("one", job_timeout=0.5, max_attempts=1)
    stubborn = q.enqueue("tests.handlers:async_stubborn", {"seconds": 30, "runs": runs})
    after = q.enqueue("tests.handlers:double", {"x": 3})
    assert after.result(timeout=15) == 6
    with pytest.raises(JobFailed) as failed:
        stubborn.result(timeout=5)
    assert "ran past job_timeout (0.5 s) and was cancelled" in failed.value.traceback
    task = client.submit(
        TaskSpec(
            name="stubborn",
            handler="tests.handlers:async_stubborn",
            subtasks=[{"seconds": 30, "runs": runs}] * 2,
            subtask_timeout=0.5,
            max_attempts=1,
            priority=10,  # takes the worker from the queue
        )
    )
    status = task.wait(timeout=20)
    assert (status.done, status.dead) == (0, 2)
    assert "ran past subtask_timeout (0.5 s)" in task.dead_letters()[0].error


@pytest.mark.system
def test_a_coroutine_that_blocks_the_loop_is_logged_and_charges_no_one_else(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """``time.sleep(3)`` in an ``async def`` with job_timeout 2 s, while 9 jobs of 0.5 s are
    in flight beside it: the blocker is logged (its job and handler) and charged; the 9,
    whose deadlines passed only while the loop was blocked, are done at their first
    attempt."""
    worker, q, runs, innocent = in_flight(cluster, client, r, "blocked", 2.0, 9, 0.5)
    blocker = q.enqueue("tests.handlers:async_blocker", {"seconds": 3.0})
    with pytest.raises(JobFailed) as failed:
        blocker.result(timeout=30)
    assert "blocked the event loop" in failed.value.traceback
    assert [j.result(timeout=30) for j in innocent] == [2 * i for i in range(9)]
    assert {j.status().attempts for j in innocent} == {1}
    assert all(int(n) == 1 for n in r.hvals(runs))
    wait_for(lambda: events(worker, "event_loop_blocked"), 10, "the block logged")
    said = events(worker, "event_loop_blocked")
    assert len(said) == 1, said  # once per block
    assert said[0]["job"] == blocker.id
    assert said[0]["handler"] == "tests.handlers:async_blocker"
    assert worker.alive()  # below the hard limit: it goes on
    assert (
        q.enqueue("tests.handlers:async_counted", {"x": 5, "seconds": 0, "runs": runs}).result(
            timeout=30
        )
        == 10
    )


@pytest.mark.system
def test_a_loop_blocked_past_the_hard_limit_exits_and_hands_back_the_rest(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """Blocked past job_timeout + grace (1 s + 1 s), the worker hands back the jobs that
    were waiting on its loop, uncharged, and exits with code 70 (hung); another worker
    runs them at their first attempt."""
    worker, q, _, innocent = in_flight(cluster, client, r, "hung", 1.0, 5, 0.8)
    blocker = q.enqueue("tests.handlers:async_blocker", {"seconds": 8.0})
    assert worker.p.wait(20) == EXIT_HUNG
    assert events(worker, "event_loop_hung"), worker.log()[-3000:]
    cluster.worker("rescuer", extra=concurrent(10))
    assert [j.result(timeout=60) for j in innocent] == [2 * i for i in range(5)]
    assert {j.status().attempts for j in innocent} == {1}  # handed back: uncharged
    assert {j.status().worker for j in innocent} == {"rescuer"}
    with pytest.raises(JobFailed) as failed:
        blocker.result(timeout=30)
    assert "timed out" in failed.value.traceback


@pytest.mark.system
def test_plain_handlers_on_threads_are_still_interrupted_alone(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """At --concurrency, a plain handler past job_timeout is interrupted on its thread by
    the watchdog; the others on the pool are not charged."""
    cluster.controller()
    cluster.worker(extra=concurrent(4))
    cluster.wait_workers(r, 1)
    q = client.queue("threads", job_timeout=0.5, max_attempts=1)
    warm(q, 1)
    hung = q.enqueue("tests.handlers:sleep_for", {"seconds": 30})
    fine = [q.enqueue("tests.handlers:sleepy_double", {"x": i, "seconds": 0.3}) for i in range(6)]
    with pytest.raises(JobFailed) as failed:
        hung.result(timeout=20)
    assert "timed out: it ran past job_timeout (0.5 s) and was abandoned" in failed.value.traceback
    assert [j.result(timeout=20)["y"] for j in fine] == [2 * i for i in range(6)]
    assert {j.status().attempts for j in fine} == {1}


# -- the event loop alone (no Redis): what the worker tests rest on ----------------------------


async def swallow(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.02)
    return "mine"


async def nap(seconds: float) -> float:
    await asyncio.sleep(seconds)
    return seconds


async def block(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@pytest.mark.unit
def test_the_loop_settles_a_coroutine_at_its_deadline_and_ignores_what_it_returns() -> None:
    aio, sink = EventLoop(), SimpleQueue[Call]()
    try:
        with capture_logs() as logs:
            aio.use(structlog.get_logger())
            call = Call(None, "j1", swallow, (1.0,))
            started = time.monotonic()
            aio.begin(call, 0.2, sink)
            aio.launch([call])
            got = sink.get(timeout=5)
            assert got is call and isinstance(call.error, TimedOut)
            assert time.monotonic() - started < 0.9  # at its deadline, not its end
            wait_for(lambda: not aio.abandoned, 5, "the abandoned coroutine to end")
        assert sink.empty() and call.value is None  # its "mine" went nowhere
        assert [e["event"] for e in logs] == ["call_timed_out", "abandoned_call_ended"]
    finally:
        aio.stop()


@pytest.mark.unit
def test_time_the_loop_spends_blocked_is_not_charged_to_the_other_calls() -> None:
    aio, sink = EventLoop(), SimpleQueue[Call]()
    try:
        with capture_logs() as logs:
            aio.use(structlog.get_logger())
            naps = [Call(None, f"n{i}", nap, (0.3,)) for i in range(5)]
            for c in naps:
                aio.begin(c, 1.0, sink)
            aio.launch(naps)
            blocker = Call(None, "b", block, (1.6,))
            aio.begin(blocker, 5.0, sink)
            aio.launch([blocker])
            got = [sink.get(timeout=10) for _ in range(6)]
            wait_for(
                lambda: any(e["event"] == "event_loop_unblocked" for e in logs), 5, "unblocked"
            )
        assert all(c.error is None for c in got), [c.error for c in got]
        assert sorted(c.value for c in got) == [0.3] * 5 + [1.6]
        blocked = [e for e in logs if e["event"] == "event_loop_blocked"]
        assert len(blocked) == 1 and blocked[0]["job"] == "b", logs
        assert blocked[0]["handler"] == f"{__name__}:block"
    finally:
        aio.stop()


def naps(seconds: float) -> None:
    """Short sleeps (a timeout lands between two: a long C call would hold it off)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


@pytest.mark.unit
def test_a_plain_call_on_a_pool_thread_keeps_its_own_timeout() -> None:
    """Two queues' jobs in one pool: a plain function runs under its own queue's
    ``job_timeout``, not the one the process's watchdog was last set to (another queue's)."""
    log = structlog.get_logger()
    watchdog = Watchdog(log, timeout=30.0)
    watchdog.start()
    flight = InFlight(2, EventLoop(), watchdog)
    try:
        strict = Call(item="strict", label="strict", fn=naps, args=(5.0,))
        patient = Call(item="patient", label="patient", fn=time.sleep, args=(0.1,))
        flight.start(strict, 0.3)
        flight.start(patient, 30.0)
        done: list[Call] = []
        deadline = time.monotonic() + 10
        while len(done) < 2 and time.monotonic() < deadline:
            done += flight.collect(0.1)
        by = {c.item: c for c in done}
        assert isinstance(by["strict"].error, TimedOut), by["strict"].error
        assert "0.3 s" in str(by["strict"].error)
        assert by["patient"].error is None
    finally:
        flight.close()
        watchdog.stop()
