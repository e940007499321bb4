"""Periodic jobs (``q.schedule``): cron and due-time arithmetic, the fire script under the
fence (exactly one job per due time, whoever fires it and however often), the catch-up rule,
the sync and asyncio clients, the CLI and the dashboard; and, with real controller and
worker processes, runs on time and across a leader killed and taken over."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client, Queue, Schedule
from queueworks.contrib.redis_server import RedisServer
from queueworks.controller.fence import Fence, Fenced
from queueworks.controller.scheduler import Scheduler
from queueworks.controller.tally import Tally
from queueworks.logs import get_logger
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import JobState
from queueworks.queue import schedules as sched
from queueworks.scripts.bound import Scripts
from tests.conftest import Cluster, Proc, wait_for

HANDLER = "queueworks.examples:double"
FAST_LEASE = {"QUEUEWORKS_LEASE_TTL": "1.0"}


def ms(text: str) -> int:
    return round(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def leader(r: Any, keys: Keys, holder: str = "test") -> Scheduler:
    """A scheduler in this process, fenced by a lease it has just taken (or taken over)."""
    scripts = Scripts(r)
    r.delete(keys.leader)
    term, token = scripts.lease_acquire(keys.leader, keys.leader_term, holder, 60_000)
    fence = Fence(r, keys, scripts, Tally())
    fence.arm(token, term)
    return Scheduler(r, keys, fence, get_logger(), Tally(), held=lambda: True)


def set_due(r: redis.Redis, keys: Keys, queue: str, name: str, due_ms: int) -> None:
    """As if the schedule's next due time were ``due_ms`` (both copies)."""
    r.zadd(keys.task(queue).schedules_due, {name: due_ms})
    r.zadd(keys.schedules, {sched.member(queue, name): due_ms})


def fired_jobs(r: redis.Redis, keys: Keys, queue: str) -> dict[str, float]:
    """Every job a schedule fired on the queue: id -> its due time (its record's ``t``)."""
    out = {}
    for key in r.scan_iter(match=keys.task(queue).job_prefix + "*", count=1000):
        job = key.decode().rsplit(":", 1)[1]
        out[job] = float(r.hget(key, "t") or 0)
    return out


# -- unit -------------------------------------------------------------------------------------


@pytest.mark.unit
def test_cron_next_and_catch_up_from_a_fixed_now() -> None:
    d = sched.definition(HANDLER, {"x": 1}, None, "*/5 * * * *")
    now = ms("2025-03-01T10:07:30")
    assert sched.first_due(d, now) == ms("2025-03-01T10:10:00")
    # on time: fires its own due time, the next is the cron's next
    assert sched.due_times(d, ms("2025-03-01T10:05:00"), now) == (
        ms("2025-03-01T10:05:00"),
        ms("2025-03-01T10:10:00"),
    )
    # an hour missed: one catch-up run, the latest missed time, then the next after now
    assert sched.due_times(d, ms("2025-03-01T09:05:00"), now) == (
        ms("2025-03-01T10:05:00"),
        ms("2025-03-01T10:10:00"),
    )
    hourly = sched.definition(HANDLER, None, None, "@hourly")
    assert sched.first_due(hourly, now) == ms("2025-03-01T11:00:00")
    daily = sched.definition(HANDLER, None, None, "30 2 * * 1")  # Mondays 02:30 UTC
    assert sched.first_due(daily, now) == ms("2025-03-03T02:30:00")


@pytest.mark.unit
def test_every_due_times_keep_their_phase_and_catch_up_once() -> None:
    d = sched.definition(HANDLER, None, 0.5, None)
    assert sched.first_due(d, 10_000) == 10_500
    assert sched.due_times(d, 10_500, 10_500) == (10_500, 11_000)
    assert sched.due_times(d, 10_500, 10_700) == (10_500, 11_000)
    assert sched.due_times(d, 10_500, 13_200) == (13_000, 13_500)  # 5 missed: one run


@pytest.mark.unit
def test_due_times_passed_while_watched_fire_each_and_before_it_once() -> None:
    d = sched.definition(HANDLER, None, 0.5, None)
    # watched since 10 s: a late pass fires every due time it passed, on the grid
    assert sched.fire_times(d, 10_500, 10_500, 10_000, 100) == ([10_500], 11_000)
    assert sched.fire_times(d, 10_500, 12_100, 10_000, 100) == (
        [10_500, 11_000, 11_500, 12_000],
        12_500,
    )
    assert sched.fire_times(d, 10_500, 12_100, 10_000, 2) == ([10_500, 11_000], 11_500)
    # due before the leader watched (since 12 s): missed while no controller ran, one run
    assert sched.fire_times(d, 10_500, 13_200, 12_000, 100) == ([13_000], 13_500)
    hourly = sched.definition(HANDLER, None, None, "0 * * * *")
    due = ms("2025-03-03T10:00:00")
    assert sched.fire_times(hourly, due, due + 2 * 3_600_000 + 5, due, 100) == (
        [due, due + 3_600_000, due + 2 * 3_600_000],
        due + 3 * 3_600_000,
    )


@pytest.mark.unit
def test_the_wait_for_a_due_time_ends_on_this_clock_not_on_a_block() -> None:
    from queueworks.controller.scheduler import POLL, SLACK, wake

    assert wake(1.0, math.inf) == (1000, 0.0)  # nothing due: block as long as the pass may
    assert wake(1.0, 5.0) == (1000, 0.0)
    block, nap = wake(1.0, 0.5)  # a block ends SLACK before the due time (Redis may be late)
    assert abs(block - (0.5 - SLACK) * 1000) <= 1 and nap == 0
    block, nap = wake(0.2, 0.2 + SLACK / 2)  # even if the pass would wait less long
    assert abs(block - (0.2 - SLACK / 2) * 1000) <= 1 and nap == 0
    assert wake(1.0, SLACK / 3) == (0, min(SLACK / 3, POLL))  # then on this clock
    assert wake(1.0, 0.002) == (0, 0.002)
    assert wake(1.0, 0.0) == (0, 0.0)  # due: fire now


@pytest.mark.unit
def test_job_id_is_a_job_id_and_depends_on_queue_name_and_due_time() -> None:
    from queueworks.protocol.jobrecords import JOB_ID

    a = sched.job_id("q", "digest", 1000)
    assert JOB_ID.match(a.encode()) and len(a) == 40
    assert a == sched.job_id("q", "digest", 1000)
    assert len({a, sched.job_id("q", "digest", 1001), sched.job_id("q2", "digest", 1000)}) == 3
    assert sched.split_member(sched.member("q", "digest")) == ("q", "digest")
    assert sched.split_member("no-separator") is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((HANDLER, {}, None, None), "every=seconds or cron"),
        ((HANDLER, {}, 1.0, "* * * * *"), "every=seconds or cron"),
        ((HANDLER, {}, 0, None), "every"),
        ((HANDLER, {}, -1, None), "every"),
        ((HANDLER, {}, float("inf"), None), "every"),
        ((HANDLER, {}, float("nan"), None), "every"),
        ((HANDLER, {}, True, None), "every"),
        ((HANDLER, {}, "1", None), "every"),
        ((HANDLER, {}, None, "61 * * * *"), "cron '61 * * * *'"),
        ((HANDLER, {}, None, "* * *"), "cron '* * *'"),
        ((HANDLER, {}, None, "* * * * * *"), "5 fields"),
        ((HANDLER, {}, None, ""), "cron ''"),
        (("os.system", {}, 1.0, None), "handler 'os.system'"),
        (("os:__import__", {}, 1.0, None), "handler"),
        ((HANDLER, {"x": {1, 2}}, 1.0, None), "payload"),
    ],
)
def test_bad_definitions_are_value_errors_naming_them(args: tuple[Any, ...], named: str) -> None:
    with pytest.raises(ValueError) as info:
        sched.definition(*args)
    assert named in str(info.value)


# -- integration: the client, the fire script, the fence --------------------------------------


@pytest.mark.integration
def test_schedule_list_replace_unschedule(client: Client, r: redis.Redis, keys: Keys) -> None:
    q = client.queue("periodic")
    before = time.time()
    s = q.schedule("digest", HANDLER, {"x": 2}, every=60.0)
    assert isinstance(s, Schedule)
    assert (s.name, s.queue, s.handler, s.payload, s.every, s.cron) == (
        "digest",
        "periodic",
        HANDLER,
        {"x": 2},
        60.0,
        None,
    )
    assert s.next_run is not None and before + 59 < s.next_run < time.time() + 61
    assert s.last_run is None and s.last_job is None
    q.schedule("hourly", HANDLER, {"x": 3}, cron="0 * * * *")
    assert [x.name for x in q.schedules()] == ["digest", "hourly"]
    assert r.zcard(keys.schedules) == 2
    assert r.sismember(keys.task("periodic").handlers, HANDLER)
    replaced = q.schedule("digest", "tests.handlers:square", {"x": 4}, cron="*/5 * * * *")
    listed = {x.name: x for x in q.schedules()}
    assert listed["digest"] == replaced
    assert (listed["digest"].handler, listed["digest"].every) == ("tests.handlers:square", None)
    assert r.zcard(keys.schedules) == 2
    assert q.unschedule("digest") is True
    assert q.unschedule("digest") is False
    assert [x.name for x in q.schedules()] == ["hourly"]
    qk = keys.task("periodic")
    assert r.zrange(keys.schedules, 0, -1) == [b"periodic/hourly"]
    assert not r.hexists(qk.schedules, "digest") and r.zscore(qk.schedules_due, "digest") is None


@pytest.mark.integration
@pytest.mark.parametrize(
    ("name", "kw", "named"),
    [
        ("bad name", {"every": 1.0}, "schedule name 'bad name'"),
        ("a/b", {"every": 1.0}, "schedule name 'a/b'"),
        ("ok", {"every": 0}, "every"),
        ("ok", {"cron": "nope"}, "cron 'nope'"),
        ("ok", {"cron": "R * * * *"}, "cron 'R * * * *'"),  # croniter's random minute
        ("ok", {"cron": "0 R(0-5) * * *"}, "cron '0 R(0-5) * * *'"),
        ("ok", {"cron": "*/5 * * * *\n"}, "cron '*/5 * * * *\\n'"),
        ("ok", {"cron": " 0 * * * *"}, "cron ' 0 * * * *'"),
        ("ok", {"cron": "0\t* * * *"}, "cron '0\\t* * * *'"),
        ("ok", {}, "every=seconds or cron"),
    ],
)
def test_schedule_refuses_bad_input(client: Client, name: str, kw: Any, named: str) -> None:
    q = client.queue("periodic")
    with pytest.raises(ValueError) as info:
        q.schedule(name, HANDLER, {"x": 1}, **kw)
    assert named in str(info.value)
    with pytest.raises(ValueError, match="payload"):
        q.schedule("ok", HANDLER, object(), every=1.0)
    assert q.schedules() == []


@pytest.mark.integration
def test_a_due_time_fires_one_plain_job_and_a_replay_fires_none(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("periodic")
    q.schedule("digest", HANDLER, {"x": 21}, every=60.0)
    s = leader(r, keys)
    assert s.step(woken=True) == 0  # not due
    due = round(time.time() * 1000) - 10
    set_due(r, keys, "periodic", "digest", due)
    assert s.step(woken=True) == 1
    job_id = sched.job_id("periodic", "digest", due)
    status = q.job(job_id).status()
    assert (status.state, status.handler) == (JobState.QUEUED, HANDLER)
    assert status.enqueued_at == due / 1000
    [listed] = q.schedules()
    assert (listed.last_run, listed.last_job) == (due / 1000, job_id)
    assert listed.next_run == (due + 60_000) / 1000
    assert r.zscore(keys.schedules, "periodic/digest") == due + 60_000
    # a stale index entry (an older leader's tick, replayed): nothing fires, the index heals
    r.zadd(keys.schedules, {"periodic/digest": due})
    assert s.step(woken=True) == 0
    assert r.zscore(keys.schedules, "periodic/digest") == due + 60_000
    assert list(fired_jobs(r, keys, "periodic")) == [job_id]
    assert r.xlen(keys.task("periodic").stream) == 1
    # the job's record there already (a tick fired, its index write lost): none more
    set_due(r, keys, "periodic", "digest", due)
    assert s.step(woken=True) == 1  # advanced, nothing written
    assert r.xlen(keys.task("periodic").stream) == 1
    assert q.job(job_id).cancel() is True  # a plain job of the queue
    assert q.job(job_id).status().state == JobState.CANCELLED


@pytest.mark.integration
def test_a_new_term_restores_the_index_from_the_queues_copies(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("periodic")
    q.schedule("digest", HANDLER, {"x": 1}, every=60.0)
    due = round(time.time() * 1000) - 10
    set_due(r, keys, "periodic", "digest", due)
    r.zrem(keys.schedules, "periodic/digest")  # its client died before writing the index
    s = leader(r, keys)
    assert s.step() == 1  # the term's first pass writes the index again, and fires
    assert list(fired_jobs(r, keys, "periodic")) == [sched.job_id("periodic", "digest", due)]
    assert r.zscore(keys.schedules, "periodic/digest") == due + 60_000


@pytest.mark.integration
def test_an_older_term_fires_nothing(client: Client, r: redis.Redis, keys: Keys) -> None:
    q = client.queue("periodic")
    q.schedule("digest", HANDLER, {"x": 1}, every=60.0)
    old = leader(r, keys, "old")
    new = leader(r, keys, "new")  # takes the lease over: a new term and token
    due = round(time.time() * 1000) - 5
    set_due(r, keys, "periodic", "digest", due)
    with pytest.raises(Fenced):
        old.step(woken=True)
    assert fired_jobs(r, keys, "periodic") == {}
    assert r.zscore(keys.task("periodic").schedules_due, "digest") == due
    assert new.step(woken=True) == 1
    assert list(fired_jobs(r, keys, "periodic")) == [sched.job_id("periodic", "digest", due)]


@pytest.mark.integration
def test_missed_ticks_fire_one_catch_up_job(client: Client, r: redis.Redis, keys: Keys) -> None:
    q = client.queue("periodic")
    q.schedule("tick", HANDLER, {"x": 1}, every=1.0)
    now = round(time.time() * 1000)
    set_due(r, keys, "periodic", "tick", now - 5_500)  # five and a half seconds unfired
    s = leader(r, keys)
    assert s.step(woken=True) == 1
    [(job, t)] = fired_jobs(r, keys, "periodic").items()
    assert t * 1000 == now - 500  # the latest due time missed
    assert job == sched.job_id("periodic", "tick", now - 500)
    assert r.zscore(keys.task("periodic").schedules_due, "tick") == now + 500
    assert s.step(woken=True) == 0


@pytest.mark.integration
def test_cancelled_and_vanished_queues_fire_nothing(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q, gone = client.queue("stopped"), client.queue("gone")
    q.schedule("tick", HANDLER, {"x": 1}, every=60.0)
    gone.schedule("tick", HANDLER, {"x": 1}, every=60.0)
    q.task.cancel()
    due = round(time.time() * 1000) - 5
    set_due(r, keys, "stopped", "tick", due)
    set_due(r, keys, "gone", "tick", due)
    r.delete(keys.task("gone").record)
    s = leader(r, keys)
    s.step(woken=True)
    assert fired_jobs(r, keys, "stopped") == {} and fired_jobs(r, keys, "gone") == {}
    # the cancelled queue's schedule waits for its next time (a reopen resumes it)...
    assert r.zscore(keys.schedules, "stopped/tick") == due + 60_000
    # ...the vanished queue's is gone from everywhere
    assert r.zscore(keys.schedules, "gone/tick") is None
    assert not r.exists(keys.task("gone").schedules_due)


@pytest.mark.integration
def test_none_due_costs_no_read_per_schedule(client: Client, r: redis.Redis, keys: Keys) -> None:
    q = client.queue("periodic")
    for i in range(50):
        q.schedule(f"s{i}", HANDLER, {"x": i}, every=600.0)
    s = leader(r, keys)
    s.step(woken=True)
    before = s.tally.commands
    for _ in range(20):
        s.step(woken=True)  # each reads the index's head, and only that
    assert s.tally.commands - before == 20
    s.step()  # nothing due, the head known: no read at all
    assert s.tally.commands - before == 20


@pytest.mark.integration
def test_async_client_schedules(redis_url: str, prefix: str) -> None:
    async def main() -> tuple[Schedule, list[Schedule], bool, bool]:
        ac = AsyncClient.from_url(redis_url, prefix=prefix)
        try:
            q = await ac.queue("periodic")
            made = await q.schedule("digest", HANDLER, {"x": 1}, cron="*/5 * * * *")
            listed = await q.schedules()
            with pytest.raises(ValueError, match="every"):
                await q.schedule("digest", HANDLER, {"x": 1}, every=-1)
            return made, listed, await q.unschedule("digest"), await q.unschedule("digest")
        finally:
            await ac.close()

    made, listed, first, second = asyncio.run(main())
    assert listed == [made] and made.cron == "*/5 * * * *"
    assert (first, second) == (True, False)


# -- system: real controllers and workers ------------------------------------------------------


def leader_proc(r: redis.Redis, keys: Keys, procs: list[Proc]) -> Proc | None:
    """The controller process holding the lease now (its id names its pid)."""
    token = (r.get(keys.leader) or b"").decode()
    for p in procs:
        if p.alive() and f"-{p.pid}-" in token.split("#")[0]:
            return p
    return None


def grid(times: list[float], start: float, step: float) -> list[int]:
    """Each due time as a tick number from ``start``; AssertionError if one is off the grid."""
    ticks = [(t - start) / step for t in times]
    assert all(abs(k - round(k)) < 1e-6 for k in ticks), ticks
    return [round(k) for k in ticks]


@pytest.mark.system
def test_every_half_second_runs_on_time_and_each_job_is_done(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    cluster.controller()
    cluster.worker()
    q = client.queue("periodic")
    made = q.schedule("tick", HANDLER, {"x": 4}, every=0.5)
    assert made.next_run is not None
    wait_for(lambda: len(fired_jobs(r, keys, "periodic")) >= 6, 60, "six runs")
    jobs = fired_jobs(r, keys, "periodic")
    now = time.time()  # after the read: a job fired while it read is due before now
    ticks = grid(sorted(jobs.values()), made.next_run, 0.5)
    assert len(set(ticks)) == len(ticks)  # (the first may be a catch-up: a slow start)
    assert max(jobs.values()) <= now  # never before its time
    assert len(jobs) <= (now - made.next_run) / 0.5 + 1
    assert all(q.job(j).result(timeout=60) == 8 for j in jobs)
    [listed] = q.schedules()
    # (it fires on meanwhile: its last job is one of those fired by now)
    assert listed.last_job in fired_jobs(r, keys, "periodic")
    assert listed.next_run is not None and listed.next_run > now - 5


@pytest.mark.system
def test_missed_ticks_while_no_controller_ran_fire_one_catch_up_job(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("periodic")
    made = q.schedule("tick", HANDLER, {"x": 1}, every=1.0)
    assert made.next_run is not None
    time.sleep(5.0)  # the property itself: five ticks pass with no controller
    cluster.controller()
    wait_for(lambda: len(fired_jobs(r, keys, "periodic")) >= 3, 60, "catch-up, then two more")
    ticks = grid(sorted(fired_jobs(r, keys, "periodic").values()), made.next_run, 1.0)
    # one catch-up run, for the latest tick missed: none of the first five, not a burst
    assert ticks[0] >= 4, ticks
    assert len(set(ticks)) == len(ticks)


@pytest.mark.system
def test_exactly_one_job_per_due_time_across_leader_kills_and_a_freeze(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """Two controllers; the leader is SIGKILLed three times (a new standby started each
    time) and once frozen (SIGSTOP) until the standby has taken over and fired, then
    resumed. Every due time's job runs once; ticks are missed only while no leader ran,
    each outage costing one catch-up run at most."""
    procs = [cluster.spawn(["controller"], f"c{i}", FAST_LEASE) for i in range(2)]
    cluster.worker()
    q = client.queue("periodic")
    log = f"{keys.prefix}:runs"
    made = q.schedule("tick", "tests.handlers:job_logged", {"x": 1, "log": log}, every=0.3)
    assert made.next_run is not None

    def fired() -> int:
        return len(fired_jobs(r, keys, "periodic"))

    def took_over(old: Proc) -> bool:
        return leader_proc(r, keys, procs) not in (None, old)

    def three_more(what: str) -> None:
        target = fired() + 3
        wait_for(lambda: fired() >= target, 60, what)

    for round_no in range(4):
        wait_for(lambda: leader_proc(r, keys, procs), 30, "a leader")
        three_more("three more runs")
        old = leader_proc(r, keys, procs)
        assert old is not None
        if round_no == 2:  # frozen past its lease: it wakes up to a tick already fired
            old.signal(signal.SIGSTOP)
            wait_for(partial(took_over, old), 30, "takeover")
            three_more("runs by the new leader")
            old.signal(signal.SIGCONT)
            continue
        old.kill()
        procs.append(cluster.spawn(["controller"], f"c{len(procs)}", FAST_LEASE))
    three_more("runs after the last takeover")
    assert q.unschedule("tick")  # no fire after it (the fire checks the queue's own copy)
    jobs = fired_jobs(r, keys, "periodic")
    for j in jobs:
        q.job(j).result(timeout=60)
    runs = [line.decode().split("|") for line in r.lrange(log, 0, -1)]
    assert sorted(job for job, *_ in runs) == sorted(jobs)  # each ran, and once
    assert all(attempt == "1" for _, _, attempt, _ in runs)
    ticks = grid(sorted(jobs.values()), made.next_run, 0.3)
    assert len(set(ticks)) == len(ticks)
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    # an outage is the lease's TTL (1 s) and a process start: seconds, not tens of them
    assert max(gaps) * 0.3 < 20, gaps


@pytest.fixture
def quiet_cluster(tmp_path: Any, prefix: str) -> Iterator[tuple[Cluster, Client]]:
    """A private Redis with its defaults (``hz 10``: a ``BLOCK`` timeout is noticed at the
    server's next cron tick, up to 0.1 s late, while nobody else talks to it), a cluster of
    processes on it and a client."""
    with RedisServer() as server:
        server.start()
        cluster = Cluster(server.url, prefix, tmp_path)
        client = Client.from_url(server.url, prefix=prefix)
        try:
            yield cluster, client
        finally:
            client.close()
            cluster.close()


def entries(client: Client, queue: str) -> list[tuple[int, float]]:
    """Each job the queue's stream holds: (its due time in ms, ms from it to its ``XADD``)."""
    out = []
    for entry_id, fields in client.redis.xrange(client.keys.task(queue).stream):
        due = float(fields[b"t"]) * 1000
        out.append((round(due), int(entry_id.split(b"-")[0]) - due))
    return out


def watched(cluster: Cluster, client: Client) -> Queue:
    """A queue "periodic", once a leader watches the schedules (its first pass has run: a
    schedule written before that is one it did not watch, caught up once)."""
    cluster.controller()
    q = client.queue("periodic")
    q.schedule("warm", HANDLER, {"x": 1}, every=0.01)
    wait_for(lambda: entries(client, "periodic"), 60, "a leader firing")
    assert q.unschedule("warm")
    client.redis.xtrim(client.keys.task("periodic").stream, maxlen=0)  # (the key stays)
    return q


@pytest.mark.system
def test_every_due_time_of_a_millisecond_schedule_fires_while_a_leader_runs(
    quiet_cluster: tuple[Cluster, Client],
) -> None:
    """A leader that is late (a pass, a slow round trip) fires the due times it passed,
    each with its own job: the one-run catch-up is only for times no controller watched."""
    cluster, client = quiet_cluster
    q = watched(cluster, client)
    made = q.schedule("tick", HANDLER, {"x": 1}, every=0.001)
    assert made.next_run is not None
    time.sleep(3.0)
    assert q.unschedule("tick")
    stopped = time.time()
    time.sleep(0.3)  # a fire under way lands
    ticks = sorted(round(due - made.next_run * 1000) for due, _ in entries(client, "periodic"))
    missed = sorted(set(range(max(ticks) + 1)) - set(ticks))
    assert not missed, f"{len(missed)} of {max(ticks) + 1} due times missed: {missed[:20]}"
    assert len(ticks) == len(set(ticks))
    # and it kept up: the due times passed before the unschedule were nearly all fired
    assert len(ticks) >= 0.5 * (stopped - made.next_run) * 1000, (len(ticks), stopped)


@pytest.mark.system
def test_a_due_job_is_enqueued_within_milliseconds_on_a_default_redis(
    quiet_cluster: tuple[Cluster, Client],
) -> None:
    """The leader wakes for a due time on its own timer, not on the end of a ``BLOCK``
    (which a quiet Redis notices up to 1/hz s late)."""
    cluster, client = quiet_cluster
    q = watched(cluster, client)
    q.schedule("tick", HANDLER, {"x": 1}, every=0.1)
    time.sleep(4.0)
    q.unschedule("tick")
    late = sorted(ms for _, ms in entries(client, "periodic"))
    assert len(late) >= 20, late
    assert late[len(late) // 2] < 20, late  # (on an unfixed leader: ~50 ms, the tick's half)


# -- the CLI and the dashboard ----------------------------------------------------------------


@pytest.mark.system
def test_cli_schedule_list_info_unschedule(redis_url: str, prefix: str, client: Client) -> None:
    from tests.test_cli import cli, one_line_error

    made = cli(
        ["schedule", "mail", "digest", HANDLER, "--json", '{"x": 3}', "--every", "30"],
        redis_url,
        prefix,
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["every"] == 30.0
    cron = cli(["schedule", "mail", "hourly", HANDLER, "--cron", "0 * * * *"], redis_url, prefix)
    assert cron.returncode == 0, cron.stderr
    for args, named in [
        (["--every", "1", "--cron", "* * * * *"], "--every or --cron"),
        (["--cron", "99 * * * *"], "cron '99 * * * *'"),  # the rest: the unit tests
        (["--every", "1", "--json", "{nope"], "--json"),
    ]:
        one_line_error(cli(["schedule", "mail", "x", HANDLER, *args], redis_url, prefix), 2, named)
    one_line_error(
        cli(["schedule", "mail", "x", "os.system", "--every", "1"], redis_url, prefix), 2, "handler"
    )
    listed = cli(["schedules", "mail", "--json"], redis_url, prefix)
    assert [s["name"] for s in json.loads(listed.stdout)] == ["digest", "hourly"]
    text = cli(["schedules", "mail"], redis_url, prefix).stdout
    assert "2 schedule(s)" in text and "every 30s" in text and "cron '0 * * * *'" in text
    info = cli(["info"], redis_url, prefix).stdout
    assert "2 schedule(s)" in info and "digest" in info
    as_json = json.loads(cli(["info", "--json"], redis_url, prefix).stdout)
    assert [s["name"] for s in as_json["schedules"]["mail"]] == ["digest", "hourly"]
    gone = cli(["unschedule", "mail", "digest"], redis_url, prefix)
    assert gone.returncode == 0 and [s.name for s in client.queue("mail").schedules()] == ["hourly"]
    one_line_error(cli(["unschedule", "mail", "digest"], redis_url, prefix), 1, "no schedule")
    one_line_error(cli(["schedules", "nosuchqueue"], redis_url, prefix), 1, "no queue nosuchqueue")
    empty = client.queue("quiet")  # a queue without schedules: listed as none, exit 0
    listed = cli(["schedules", empty.name], redis_url, prefix)
    assert listed.returncode == 0 and "0 schedule(s) of queue quiet" in listed.stdout, listed


@pytest.mark.integration
def test_dashboard_lists_a_queues_schedules(client: Client) -> None:
    from tests.test_dashboard import make_app

    q = client.queue("mail")
    q.schedule("digest", HANDLER, {"x": 1}, every=90.0)
    q.schedule("nightly", "tests.handlers:square", {"x": 2}, cron="0 3 * * *")
    with make_app(client) as web:
        body = web.get("/api/queues/mail/schedules").json()
        assert body["count"] == 2
        assert [(s["name"], s["every"], s["cron"]) for s in body["schedules"]] == [
            ("digest", 90.0, None),
            ("nightly", None, "0 3 * * *"),
        ]
        assert web.get("/api/queues/nope/schedules").status_code == 404
        page = web.get("/queues/mail").text
        assert 'id="schedules"' in page and "nightly" in page and "0 3 * * *" in page
        assert [s["name"] for s in web.get("/api/queues/mail").json()["schedules"]] == [
            "digest",
            "nightly",
        ]
