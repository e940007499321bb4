"""``queueworks worker --processes N``: a supervisor keeps N worker processes running; a
member that hangs, dies or retires is replaced and the others never stop serving; a stop
is passed on to every member; a member that fails at start-up is started again with a
growing wait, never in a loop."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from queueworks import Client, JobFailed, Queue
from queueworks.cli import main as cli
from queueworks.cli.info import render
from queueworks.cli.options import given_options
from queueworks.protocol.keys import Keys
from queueworks.transport.pools import PoolRecord, read_pool
from queueworks.workers.watchdog import EXIT_HUNG
from tests.conftest import Cluster, Proc, wait_for
from tests.test_cancel_running import deaf
from tests.test_dashboard import make_app


def pool(cluster: Cluster, name: str, *extra: str) -> Proc:
    return cluster.worker(name, extra=list(extra))


def record(r: redis.Redis, cluster: Cluster, pool_id: str) -> PoolRecord | None:
    return read_pool(r, Keys(cluster.prefix), pool_id)


def members(r: redis.Redis, cluster: Cluster, pool_id: str, n: int) -> list[str]:
    """The pool's members, once ``n`` of them run and are registered as workers."""
    keys = Keys(cluster.prefix)

    def up() -> list[str] | None:
        rec = record(r, cluster, pool_id)
        if rec is None or len(rec.members) != n:
            return None
        registered = all(r.exists(keys.worker_heartbeat(m)) for m in rec.members)
        return rec.members if registered else None

    found: list[str] = wait_for(up, 60, f"{n} members of {pool_id} registered")
    return found


def pid_of(client: Client, member: str) -> int:
    return next(w.pid for w in client.workers() if w.id == member)


def events(proc: Proc, name: str) -> list[dict[str, Any]]:
    out = []
    for line in proc.log().splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            event = json.loads(line)
            if event["event"] == name:
                out.append(event)
    return out


def warm(q: Queue) -> None:
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=60) == 2


@pytest.mark.system
def test_a_hung_handler_costs_its_member_a_moment_and_the_sibling_keeps_serving(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A sync handler blocked in C (``time.sleep(3)``) past job_timeout (1 s) and its hard
    limit (1 s more): its member exits hung and the supervisor starts another at once; the
    sibling serves other jobs all along; the job runs again (attempt 2) and succeeds."""
    cluster.controller()
    proc = pool(cluster, "hp", "--processes", "2")
    first = members(r, cluster, "hp", 2)
    q = client.queue("hung", job_timeout=1.0, max_attempts=2)
    warm(q)
    log = f"{cluster.prefix}:attempts"
    stuck = q.enqueue("tests.handlers:slow_first", {"log": log, "seconds": 3.0})
    wait_for(lambda: r.llen(log) == 1, 30, "the slow job started")
    hung = stuck.status().worker
    assert hung in first
    sibling = next(m for m in first if m != hung)
    sibling_pid = pid_of(client, sibling)
    # while the one member is stuck and then replaced, the other goes on serving
    quick = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(20)]
    assert [j.result(timeout=60) for j in quick] == [2 * i for i in range(20)]
    assert stuck.result(timeout=60) == 2
    assert [int(a) for a in r.lrange(log, 0, -1)] == [1, 2]
    exited = [e for e in events(proc, "pool_member_exited") if e["member"] == hung]
    assert exited and exited[0]["exit_code"] == EXIT_HUNG, proc.log()[-3000:]
    now = members(r, cluster, "hp", 2)
    assert sibling in now and hung not in now
    assert pid_of(client, sibling) == sibling_pid  # never restarted
    rec = record(r, cluster, "hp")
    assert rec is not None and (rec.restarts, rec.failed) == (1, 1)
    assert not events(proc, "pool_member_failing_at_start")  # replaced at once
    assert proc.terminate(30) == 0


@pytest.mark.system
def test_a_cancelled_handler_that_cannot_hear_is_stopped_by_its_members_replacement(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """In a pool, ``job.cancel()`` on a plain handler with no safe point stops it at once:
    its call is interrupted, or else its member's process ends (the supervisor starts a
    fresh one at once). The handler never finishes, the job stays cancelled and never
    runs again, and the pool serves on."""
    proc = pool(cluster, "cn", "--processes", "2", "--allow", "tests.test_cancel_running")
    first = members(r, cluster, "cn", 2)
    q = client.queue("cancel-deaf", job_timeout=120)
    warm(q)
    key = f"{cluster.prefix}:said"
    job = q.enqueue(deaf, {"seconds": 5, "key": key})  # says "ran", then "done" 5 s on
    wait_for(lambda: r.lrange(key, 0, -1) == [b"ran"], 60, "the handler running")
    victim = job.status().worker
    assert victim in first
    assert job.cancel() is True
    time.sleep(6.5)  # past the handler's own end: had it run on, it would have said so
    assert r.lrange(key, 0, -1) == [b"ran"]  # it never finished
    exited = [e for e in events(proc, "pool_member_exited") if e["member"] == victim]
    assert all(e["exit_code"] == EXIT_HUNG for e in exited), exited  # (ended, or its process)
    assert [q.enqueue("tests.handlers:double", {"x": i}).result(timeout=60) for i in range(4)] == [
        0, 2, 4, 6,
    ]  # fmt: skip
    assert job.status().state == "cancelled"
    assert proc.terminate(30) == 0


@pytest.mark.system
def test_a_member_that_overruns_on_its_last_attempt_is_dead_lettered_saying_so(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """One attempt only: the job whose handler hung its member is dead-lettered, and what
    it says names the limit it overran; the pool goes on with a fresh member."""
    cluster.controller()
    proc = pool(cluster, "hd", "--processes", "2")
    members(r, cluster, "hd", 2)
    q = client.queue("hungdead", job_timeout=1.0, max_attempts=1)
    warm(q)
    log = f"{cluster.prefix}:attempts"
    stuck = q.enqueue("tests.handlers:slow_first", {"log": log, "seconds": 3.0})
    with pytest.raises(JobFailed) as failed:
        stuck.result(timeout=60)
    assert "max_attempts" in failed.value.reason
    assert "overran its time limit" in failed.value.traceback
    assert q.enqueue("tests.handlers:double", {"x": 4}).result(timeout=60) == 8
    members(r, cluster, "hd", 2)
    assert proc.terminate(30) == 0


@pytest.mark.system
def test_a_sigkilled_member_is_replaced_within_3_s(
    cluster: Cluster, client: Client, r: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """Replaced at once; ``info``, ``health``, ``/api/workers`` and ``/metrics`` show the
    pool, its members and the restart."""
    cluster.controller()
    id_file = tmp_path / "pool.id"
    proc = pool(cluster, "kp", "--processes", "2", "--id-file", str(id_file))
    first = members(r, cluster, "kp", 2)
    os.kill(pid_of(client, first[0]), signal.SIGKILL)
    killed = time.monotonic()

    def replaced() -> bool:
        rec = record(r, cluster, "kp")
        return rec is not None and len(rec.members) == 2 and first[0] not in rec.members

    wait_for(replaced, 3.0, "a new member in the killed one's place")
    assert time.monotonic() - killed < 3.0
    now = members(r, cluster, "kp", 2)  # registered too (its interpreter takes a moment)
    assert first[1] in now
    exited = [e for e in events(proc, "pool_member_exited") if e["member"] == first[0]]
    assert exited and exited[0]["exit_code"] == -signal.SIGKILL
    q = client.queue("afterkill")
    warm(q)
    wait_for(lambda: (rec := record(r, cluster, "kp")) and rec.restarts == 1, 5, "the record")

    shown = json.loads(render(client, as_json=True))["pools"]
    assert [(p["id"], sorted(p["members"]), p["restarts"], p["failed"]) for p in shown] == [
        ("kp", sorted(now), 1, 1)
    ]
    assert "1 pool(s)" in render(client) and "restarts=1 (retired=0 failed=1)" in render(client)
    health = ["health", "--redis", redis_url, "--prefix", cluster.prefix, "--id-file"]
    assert id_file.read_text() == "kp"
    assert CliRunner().invoke(cli, [*health, str(id_file)]).exit_code == 0
    with make_app(client) as web:
        assert [p["id"] for p in web.get("/api/workers").json()["pools"]] == ["kp"]
        page = web.get("/workers").text
        assert 'data-pool="kp"' in page and all(f"<code>{m}</code>" in page for m in now)
        text = web.get("/metrics").text
        assert 'queueworks_pool_members{pool="kp"} 2' in text
        assert 'queueworks_pool_restarts_total{pool="kp",why="failed"} 1' in text
    assert proc.terminate(30) == 0
    gone = CliRunner().invoke(cli, [*health, str(id_file)])
    assert gone.exit_code == 2 and "kp has no heartbeat" in gone.output


@pytest.mark.system
def test_members_retire_after_max_jobs_and_every_job_runs_exactly_once(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """--max-jobs-per-child 5: members leave gracefully (exit 0) and fresh ones start;
    60 jobs run exactly once, each at its first attempt. (No safe point in them: a job
    stopped at one, by a member joining the queue, runs again by design.)"""
    cluster.controller()
    proc = pool(cluster, "rp", "--processes", "2", "--max-jobs-per-child", "5")
    members(r, cluster, "rp", 2)
    q = client.queue("recycle", max_attempts=1)
    log = f"{cluster.prefix}:runs"
    jobs = [
        q.enqueue("tests.handlers:job_logged", {"x": i, "log": log, "seconds": 0})
        for i in range(60)
    ]
    assert [j.result(timeout=180) for j in jobs] == [2 * i for i in range(60)]
    runs = [line.decode().split("|") for line in r.lrange(log, 0, -1)]
    twice = [run for run in runs if [r[0] for r in runs].count(run[0]) > 1]
    assert sorted(job for job, _, _, _ in runs) == sorted(j.id for j in jobs), twice
    assert {attempt for _, _, attempt, _ in runs} == {"1"}
    ran_on = {worker for _, worker, _, _ in runs}
    assert len(ran_on) == 60 // 5, ran_on  # 5 jobs per member, then a fresh one
    retiring = events(proc, "worker_retiring")
    assert retiring and all("ran 5 jobs" in e["why"] for e in retiring), retiring
    assert all(e["exit_code"] == 0 for e in events(proc, "pool_member_exited"))
    rec = record(r, cluster, "rp")
    assert rec is not None and rec.retired >= len(ran_on) - 2 and rec.failed == 0
    assert not events(proc, "pool_member_failing_at_start")
    assert proc.terminate(30) == 0


@pytest.mark.system
def test_a_member_past_its_memory_limit_retires_after_the_job(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """--max-memory-per-child 1 (MB, less than any Python process): each member retires
    after its first job, never before one (no loop of starts); each job runs once."""
    cluster.controller()
    proc = pool(cluster, "mp", "--processes", "2", "--max-memory-per-child", "1")
    members(r, cluster, "mp", 2)
    time.sleep(1.0)  # idle members over the limit stay: it is looked at after a job
    assert not events(proc, "worker_retiring")
    q = client.queue("memory", max_attempts=1)
    log = f"{cluster.prefix}:runs"
    jobs = [q.enqueue("tests.handlers:job_logged", {"x": i, "log": log}) for i in range(4)]
    assert [j.result(timeout=120) for j in jobs] == [0, 2, 4, 6]
    runs = [line.decode().split("|") for line in r.lrange(log, 0, -1)]
    assert sorted(job for job, _, _, _ in runs) == sorted(j.id for j in jobs)
    assert len({worker for _, worker, _, _ in runs}) == 4  # a fresh member for each job
    retiring = events(proc, "worker_retiring")
    assert retiring and all("max_memory_per_child=1" in e["why"] for e in retiring)
    assert not events(proc, "pool_member_failing_at_start")
    assert proc.terminate(30) == 0


@pytest.mark.system
def test_sigterm_stops_every_member_gracefully_and_the_pool_exits_0(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """SIGTERM to the supervisor: each member finishes what it runs, leaves and exits 0;
    then the supervisor exits 0, and its record and its members' are gone."""
    cluster.controller()
    proc = pool(cluster, "tp", "--processes", "2")
    first = members(r, cluster, "tp", 2)
    q = client.queue("term", max_attempts=1)
    warm(q)
    long = q.enqueue("tests.handlers:sleep_for", {"seconds": 2.0})  # no safe point in it
    wait_for(lambda: long.status().state == "running", 30, "the long job started")
    proc.signal(signal.SIGTERM)
    assert proc.p.wait(60) == 0, proc.log()[-3000:]
    assert long.status().state == "done"  # finished by its member before it left
    left = events(proc, "pool_member_left")
    assert sorted(e["member"] for e in left) == sorted(first)
    assert {e["exit_code"] for e in left} == {0}
    assert len(events(proc, "worker_stopped")) == 2
    keys = Keys(cluster.prefix)
    assert r.zcard(keys.workers) == 0
    assert record(r, cluster, "tp") is None and not r.zscore(keys.pools, "tp")


@pytest.mark.system
def test_a_second_sigterm_stops_the_members_cold(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A member waits for its job on the first SIGTERM (a grace of 60 s); the second one,
    passed on, interrupts it: the pool exits at once, 1 (a cold stop)."""
    cluster.controller()
    proc = pool(cluster, "cp", "--processes", "2", "--grace-period", "60")
    members(r, cluster, "cp", 2)
    q = client.queue("cold", max_attempts=2)
    warm(q)
    long = q.enqueue("tests.handlers:sleep_for", {"seconds": 60.0})
    wait_for(lambda: long.status().state == "running", 30, "the long job started")
    busy = long.status().worker
    proc.signal(signal.SIGTERM)
    wait_for(lambda: len(events(proc, "pool_member_left")) == 1, 30, "the idle member left")
    assert proc.alive()  # the busy one finishes its job first
    sent = time.monotonic()
    proc.signal(signal.SIGTERM)
    assert proc.p.wait(30) == 1
    assert time.monotonic() - sent < 15
    left = {e["member"]: e["exit_code"] for e in events(proc, "pool_member_left")}
    assert left[busy] == 1 and set(left.values()) == {0, 1}, left


@pytest.mark.system
def test_a_member_failing_at_start_up_is_started_again_with_a_growing_wait(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """Members refuse an evicting Redis at start-up (exit 1, never up): each is started
    again after 1 s, then 2 s, then 4 s (one log line each), not in a loop; once Redis is
    fixed they come up and the pool serves."""
    before = r.config_get("maxmemory-policy")["maxmemory-policy"]
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        proc = pool(cluster, "fp", "--processes", "2")
        wait_for(
            lambda: len(events(proc, "pool_member_failing_at_start")) >= 4,
            60,
            "two failed starts of each member",
        )
        time.sleep(1.0)
        failing = events(proc, "pool_member_failing_at_start")
        waits: dict[int, list[float]] = {}
        for e in failing:
            waits.setdefault(e["failures"], []).append(e["next_start_in"])
        assert waits[1] == [1.0, 1.0] and set(waits[2]) == {2.0}, failing
        started = events(proc, "pool_member_started")
        assert len(started) <= 2 * 3  # the first start, and one after each wait so far
        wait_for(  # the record says so while a member waits to start again
            lambda: (rec := record(r, cluster, "fp")) and rec.backoff > 0 and rec.failed >= 4,
            20,
            "a record with a wait and the failures",
        )
    finally:
        r.config_set("maxmemory-policy", before)
    cluster.controller()
    members(r, cluster, "fp", 2)  # within the current wait (at most 8 s)
    warm(client.queue("failing"))
    assert proc.terminate(30) == 0


@pytest.mark.unit
def test_processes_takes_a_count_or_auto() -> None:
    worker = cli.commands["worker"]
    assert worker.make_context("worker", ["--processes", "3"]).params["processes"] == 3
    auto = worker.make_context("worker", ["--processes", "auto"]).params["processes"]
    assert auto == len(os.sched_getaffinity(0)) >= 1
    for bad in ("0", "-1", "two", "1.5"):
        result = CliRunner().invoke(cli, ["worker", "--processes", bad])
        assert result.exit_code == 2 and "--processes" in result.output, (bad, result.output)


@pytest.mark.unit
def test_members_get_the_options_given_to_the_pool() -> None:
    """What the supervisor passes on: every option given on its line (its own aside), as
    given; the environment's travel with the environment."""
    argv = ["--processes", "2", "--name", "p", "--allow", "a.", "--allow", "b", "--label"]
    argv += ["k=v", "--queues", "x, y", "--concurrency", "3", "--allow-eviction", "--cluster"]
    argv += ["--max-jobs-per-child", "5", "--id-file", "pool.id"]
    ctx = cli.commands["worker"].make_context("worker", argv)
    assert given_options(ctx, skip={"name", "id_file", "processes"}) == [
        "--cluster",
        "--allow",
        "a.",
        "--allow",
        "b",
        "--label",
        "k=v",
        "--queues",
        "x,y",
        "--concurrency",
        "3",
        "--max-jobs-per-child",
        "5",
        "--allow-eviction",
    ]
