"""Priorities inside a queue: ``enqueue(..., priority=N)`` from -5 to 5, higher first, in
order of enqueue within one priority; a job of a higher priority behind a deep backlog
starts within a few starts; every per-job guarantee holds for a prioritised job. Real
Redis, real worker processes, a real SIGKILL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from queueworks import AsyncClient, Client
from queueworks.cli import main
from queueworks.cli.options import given_options
from queueworks.dashboard.queue_reader import QueueReader
from queueworks.examples import add
from queueworks.protocol.models import JobState
from queueworks.protocol.priorities import HIGHEST, LOWEST, priority_of_id
from queueworks.queue.job_lists import plan_job_counts
from queueworks.transport.runner import run
from tests.conftest import Cluster, wait_for
from tests.test_queue_ready import monitored

pytestmark = pytest.mark.system

ALLOW = ("tests.handlers_priority", "tests.handlers")
BEAT = ["--heartbeat-interval", "0.5", "--heartbeat-ttl", "2"]
LOG = "tests.handlers_priority:log_start"


def said(r: redis.Redis, key: str) -> list[str]:
    return [x.decode() for x in r.lrange(key, 0, -1)]


@pytest.mark.parametrize("bad", [LOWEST - 1, HIGHEST + 1, 1.5, "3", True])
def test_a_priority_out_of_range_is_refused_naming_it(client: Client, bad: Any) -> None:
    q = client.queue("prio")
    with pytest.raises(ValueError, match=rf"priority.*{bad!r}"):
        q.enqueue(LOG, {}, priority=bad)
    with pytest.raises(ValueError, match="priority"):
        q.enqueue_many([(LOG, {})], priority=bad)
    assert q.status().backlog == 0


def test_async_enqueue_takes_a_priority_and_refuses_a_bad_one(
    redis_url: str, prefix: str, r: redis.Redis
) -> None:
    async def go() -> list[str]:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as client:
            q = await client.queue("prio")
            with pytest.raises(ValueError, match=r"priority.*9"):
                await q.enqueue(LOG, {}, priority=9)
            one = await q.enqueue(LOG, {"tag": "a"}, priority=3)
            many = await q.enqueue_many([(LOG, {"tag": "b"})], priority=-2)
            return [one.id, *(j.id for j in many)]

    ids = asyncio.run(go())
    assert [priority_of_id(i) for i in ids] == [3, -2]


def test_higher_first_and_in_order_within_one_priority(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    q = client.queue("prio")
    log = f"{client.keys.prefix}:log"
    order = [0, 2, -1, 2, 0, 5, -1, 5, 0]
    jobs = []
    for n, p in enumerate(order):
        jobs.append(q.enqueue(LOG, {"log": log, "tag": f"{p}/{n}"}, priority=p))
    many = q.enqueue_many([(LOG, {"log": log, "tag": f"3/{n}"}) for n in range(9, 12)], priority=3)
    typed = q.enqueue(add.call(2, 3), priority=-5)  # a typed call takes one as any job
    typed_many = q.enqueue_many([add.call(1, 1)], priority=-5)
    cluster.worker(allow=(*ALLOW, "queueworks.examples"), extra=BEAT)
    for job in [*jobs, *many]:
        job.result(timeout=60)
    assert typed.result(timeout=60) == 5 and typed_many[0].result(timeout=60) == 2
    assert priority_of_id(typed.id) == -5 == priority_of_id(typed_many[0].id)
    expected = sorted(
        [f"{p}/{n}" for n, p in enumerate(order)] + [f"3/{n}" for n in range(9, 12)],
        key=lambda tag: (-int(tag.split("/")[0]), int(tag.split("/")[1])),
    )
    assert said(r, log) == expected


def test_a_high_job_behind_a_deep_backlog_starts_within_a_few_starts(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    q = client.queue("deep")
    log = f"{client.keys.prefix}:log"
    q.enqueue(LOG, {"log": log, "tag": "warm"}, priority=5)  # the band exists
    backlog = q.enqueue_many([(LOG, {"log": log, "tag": "low", "seconds": 0.005})] * 5000)
    cluster.worker(allow=ALLOW, extra=BEAT)
    wait_for(lambda: r.llen(log) > 50, 60, "the backlog running")
    high = q.enqueue(LOG, {"log": log, "tag": "high"}, priority=5)
    before = r.llen(log)
    high.result(timeout=60)
    started = said(r, log)
    after = started.index("high") - before
    assert after <= 12, f"{after} backlog jobs started before the high one"
    assert q.job(backlog[-1].id).status().state == JobState.QUEUED  # the backlog waits on


def backlog_of(q: Any, log: str, n: int, seconds: float) -> list[Any]:
    return q.enqueue_many([(LOG, {"log": log, "tag": "low", "seconds": seconds})] * n)


def test_retries_delayed_and_dependent_jobs_keep_their_priority(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """A retry that waited, a delayed job and a dependent, each released behind a backlog
    of 400 jobs (8 s of work), all run while most of it still waits: back on their band."""
    q = client.queue("keep", max_attempts=3)
    log = f"{client.keys.prefix}:log"
    q.enqueue(LOG, {"log": log, "tag": "warm"}, priority=4)
    backlog = backlog_of(q, log, 400, 0.02)
    cluster.worker(allow=ALLOW, extra=BEAT)
    wait_for(lambda: r.llen(log) > 5, 60, "the backlog running")
    retried = q.enqueue(LOG, {"log": log, "tag": "retry", "fail": 1}, priority=4, retry_delay=0.3)
    delayed = q.enqueue(LOG, {"log": log, "tag": "delayed"}, priority=4, delay=0.3)
    first = q.enqueue(LOG, {"log": log, "tag": "first", "seconds": 0.3}, priority=4)
    dependent = q.enqueue(LOG, {"log": log, "tag": "dependent"}, priority=4, depends_on=[first])
    for job in (retried, delayed, dependent):
        job.result(timeout=60)
    assert retried.status().attempts == 2
    assert q.job(backlog[200].id).status().state == JobState.QUEUED
    started = said(r, log)
    assert started.count("retry") == 2 and started.index("dependent") > started.index("first")


def test_an_idle_member_reads_the_bands_set_only_when_a_band_is_added(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """An idle member's look at its queue reads the aside set, not the bands set: that it
    reads only when the queue's record says a band was added, so an idle look costs what
    it did without priorities. A job on a new band starts at once all the same, and so does
    a dependent one, whose band was made when it was enqueued."""
    q = client.queue("idle")
    log = f"{client.keys.prefix}:log"
    q.enqueue(LOG, {"log": log, "tag": "warm"}, priority=2)
    cluster.worker(allow=ALLOW, extra=BEAT)
    wait_for(lambda: said(r, log) == ["warm"], 60, "the first job run")
    time.sleep(0.5)  # (its settle)
    tk = client.keys.task("idle")
    seen = monitored(r, 2.0)
    looks = [line for line in seen if f'"SMEMBERS" "{tk.aside}"'.encode() in line]
    assert len(looks) >= 2, "the member looked at its queue"  # (every 0.25 s)
    assert not [line for line in seen if f'"SMEMBERS" "{tk.bands}"'.encode() in line]
    first = q.enqueue(LOG, {"log": log, "tag": "first", "seconds": 0.3})
    dependent = q.enqueue(LOG, {"log": log, "tag": "dependent"}, priority=-3, depends_on=[first])
    assert dependent.result(timeout=10) == "dependent"
    for p in (4, -1):
        job = q.enqueue(LOG, {"log": log, "tag": str(p)}, priority=p)
        assert job.result(timeout=10) == str(p)
        status = job.status()
        assert status.started_at is not None and status.enqueued_at is not None
        assert status.started_at - status.enqueued_at < 2.0, status


def test_a_dead_prioritised_job_requeued_runs_on_its_band(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    q = client.queue("dead", max_attempts=1)
    log, fail = f"{client.keys.prefix}:log", f"{client.keys.prefix}:fail"
    r.set(fail, 1)
    doomed = q.enqueue(LOG, {"log": log, "tag": "doomed", "fail_while": fail}, priority=3)
    backlog = backlog_of(q, log, 400, 0.02)
    cluster.worker(allow=ALLOW, extra=BEAT)
    wait_for(lambda: doomed.status().state == JobState.DEAD, 60, "the job dead")
    r.delete(fail)
    assert q.requeue_dead() == 1
    assert doomed.result(timeout=60) == "doomed"
    assert q.job(backlog[200].id).status().state == JobState.QUEUED


def test_a_prioritised_job_of_a_killed_worker_runs_again(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    q = client.queue("kill", max_attempts=3)
    log = f"{client.keys.prefix}:log"
    job = q.enqueue(LOG, {"log": log, "tag": "long", "seconds": 30, "fail": 0}, priority=2)
    first = cluster.worker(allow=ALLOW, extra=BEAT)
    wait_for(lambda: r.llen(log) == 1, 60, "the job started")
    first.kill()
    q.enqueue(LOG, {"log": log, "tag": "quick"}, priority=2)  # (the band's reads go on)
    job_again = q.job(job.id)
    cluster.worker(allow=ALLOW, extra=BEAT)
    wait_for(lambda: said(r, log).count("long") == 2, 60, "the job run again elsewhere")
    assert job_again.status().attempts == 2


def test_prioritised_jobs_are_counted_listed_cancelled_and_emptied(
    client: Client, r: redis.Redis
) -> None:
    q = client.queue("count")
    low = q.enqueue(LOG, {"tag": "low"}, priority=-3)
    plain = q.enqueue(LOG, {"tag": "plain"})
    high = q.enqueue(LOG, {"tag": "high"}, priority=5)
    extra = q.enqueue_many([(LOG, {"tag": "x"})] * 3, priority=1)
    assert q.status().backlog == 6
    counts = run(r, client.scripts, plan_job_counts(client.keys, "count"))  # the dashboard's
    assert counts["queued"] == 6
    assert QueueReader(client).summary("count").backlog == 6  # its queues page
    page = q.jobs("queued")
    assert page.total == 6
    assert [j.id for j in page.jobs] == [high.id, *(j.id for j in extra), plain.id, low.id]
    assert q.jobs("queued", limit=2, offset=3).jobs[0].id == extra[2].id
    assert (high.status().state, high.status().priority, plain.status().priority) == (
        JobState.QUEUED,
        5,
        0,
    )
    assert high.cancel() is True
    assert high.status().state == JobState.CANCELLED
    assert q.status().backlog == 5
    assert q.empty() == 5
    assert q.status().backlog == 0
    assert low.status().state == JobState.CANCELLED


def test_worker_queue_weights_share_its_starts_about_3_to_1(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    log = f"{client.keys.prefix}:log"
    for name in ("high", "default"):
        client.queue(name).enqueue_many([(LOG, {"log": log, "tag": name, "seconds": 0.005})] * 400)
    cluster.worker(allow=ALLOW, extra=[*BEAT, "--queues", "high:3,default:1"])
    wait_for(lambda: r.llen(log) >= 300, 120, "300 starts")
    started = said(r, log)[:300]
    ratio = started.count("high") / max(1, started.count("default"))
    assert 2.0 <= ratio <= 4.5, f"high:default = {ratio:.2f}"


def test_worker_queues_without_weights_share_alike(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    log = f"{client.keys.prefix}:log"
    for name in ("a", "b"):
        client.queue(name).enqueue_many([(LOG, {"log": log, "tag": name, "seconds": 0.005})] * 300)
    cluster.worker(allow=ALLOW, extra=[*BEAT, "--queues", "a,b"])
    wait_for(lambda: r.llen(log) >= 200, 120, "200 starts")
    started = said(r, log)[:200]
    ratio = started.count("a") / max(1, started.count("b"))
    assert 0.6 <= ratio <= 1.6, f"a:b = {ratio:.2f}"


@pytest.mark.parametrize("bad", ["high:x", "high:0", "high:-1", "high:1.5"])
def test_a_bad_queue_weight_is_a_clear_cli_error(bad: str) -> None:
    res = CliRunner().invoke(main, ["worker", "--queues", bad], prog_name="queueworks")
    assert res.exit_code == 2
    assert "--queues" in res.output and "weight of queue 'high'" in res.output


def test_cli_enqueue_takes_a_priority(redis_url: str, prefix: str, client: Client) -> None:
    env = {"QUEUEWORKS_REDIS_URL": redis_url, "QUEUEWORKS_PREFIX": prefix}
    args = ["enqueue", "cli", LOG, "--json", '{"tag": "x"}', "--priority", "4"]
    res = CliRunner().invoke(main, args, env=env, prog_name="queueworks")
    assert res.exit_code == 0, res.output
    assert priority_of_id(res.output.strip()) == 4
    bad = CliRunner().invoke(main, [*args[:-1], "9"], env=env, prog_name="queueworks")
    assert bad.exit_code == 2 and "--priority" in bad.output and "9" in bad.output
    shown = CliRunner().invoke(main, ["job", f"cli/{res.output.strip()}"], env=env)
    assert "priority  4" in shown.output, shown.output
    assert client.queue("cli").status().backlog == 1


def test_a_prioritised_job_that_waited_for_its_group_slot_keeps_its_priority(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    q = client.queue("grouped", group_limit=1)
    log = f"{client.keys.prefix}:log"
    q.enqueue(LOG, {"log": log, "tag": "warm"}, priority=3)
    backlog = backlog_of(q, log, 400, 0.02)
    holder = q.enqueue(LOG, {"log": log, "tag": "holder", "seconds": 1}, priority=3, group="g")
    waiter = q.enqueue(LOG, {"log": log, "tag": "waiter"}, priority=3, group="g")
    cluster.worker(allow=ALLOW, extra=[*BEAT, "--concurrency", "2"])
    assert waiter.result(timeout=60) == "waiter"
    assert holder.status().state == JobState.DONE
    assert q.job(backlog[200].id).status().state == JobState.QUEUED


def test_a_pool_passes_the_queue_weights_on_to_its_members() -> None:
    argv = ["--processes", "2", "--queues", "high:3, default"]
    ctx = main.commands["worker"].make_context("worker", argv)
    assert given_options(ctx, skip={"processes"}) == ["--queues", "high:3,default"]
