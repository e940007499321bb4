"""Flow control (``queueworks.queue.flow``): a queue's ``rate_limit`` (a token bucket in Redis,
taken atomically with the read) and ``group_limit`` (slots per group, held by the job,
given back by its settle and handed to the oldest waiting job of the group). The scripts
on a real Redis, then real worker processes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
import redis

from queueworks import AsyncClient, Client
from queueworks.cli.info import _queues
from queueworks.controller.feed import Feed
from queueworks.controller.fence import Fence
from queueworks.controller.reconciler import Reconciler
from queueworks.controller.tally import Tally
from queueworks.logs import get_logger
from queueworks.protocol.job_options import JobOptions
from queueworks.protocol.jobrecords import JOB_ENTRY, JOB_STATE, JOB_WHY, JobEntry, decode_entry
from queueworks.protocol.keys import GROUP, Keys, TaskKeys
from queueworks.queue.flow import plan_pump
from queueworks.queue.queue_settings import check_queue_settings
from queueworks.scripts.bound import JobBatch, Scripts
from queueworks.scripts.flow_calls import burst_of
from queueworks.transport.runner import run
from queueworks.workers.flow_gate import Pump, sweep_held
from tests.conftest import Cluster, wait_for
from tests.handlers_flow import read_log
from tests.test_cli import cli, one_line_error
from tests.test_dashboard import make_app, metric_values

NOTED = "tests.handlers_flow:noted"
ALLOW = ("tests.handlers_flow",)

# -- settings and options (unit) ----------------------------------------------------------


@pytest.mark.unit
def test_limits_and_groups_are_checked_where_they_enter() -> None:
    for bad, what in (
        ({"rate_limit": 0}, "rate_limit"),
        ({"rate_limit": float("nan")}, "rate_limit"),
        ({"group_limit": 0}, "group_limit"),
        ({"group_limit": 1.5}, "group_limit"),
    ):
        with pytest.raises(ValueError, match=what):
            check_queue_settings(bad)
    assert check_queue_settings({"rate_limit": 2.5, "group_limit": 3}) == {
        "rate_limit": 2.5,
        "group_limit": 3,
    }
    for bad in ("", "a\nb", "x" * 300, 7):
        with pytest.raises(ValueError, match="group"):
            JobOptions.given(group=bad)
    options = JobOptions.given(group="tenant-7")
    assert options is not None and options.json() == '{"group":"tenant-7"}'
    assert JobOptions.parse(options.json()).group == "tenant-7"
    assert JobOptions.parse('{"group":"bad\\u0000"}').group is None  # written by hand: none
    assert [burst_of(r) for r in (0.5, 10, 50, 1000)] == [1, 1, 5, 100]


# -- the scripts (integration) ------------------------------------------------------------


def _stream(r: redis.Redis, tk: TaskKeys, n: int, options: str = "") -> list[str]:
    r.xgroup_create(tk.stream, GROUP, id="0", mkstream=True)
    fields = {"h": "m:f", "p": "{}", "t": repr(time.time())}
    if options:
        fields["o"] = options
    return [r.xadd(tk.stream, fields).decode() for _ in range(n)]  # type: ignore[union-attr]


def _read(scripts: Scripts, tk: TaskKeys, who: str, rate: float, want: int) -> tuple[int, int]:
    read, wait = scripts.rate_read(tk, [tk.stream], who, rate, want)
    return sum(len(entries) for _, entries in read), wait


@pytest.mark.integration
def test_the_bucket_bursts_then_refills_by_time(r: redis.Redis, keys: Keys) -> None:
    # 4 jobs/s: a burst of 1, a token every 250 ms (a loaded machine's gap between two
    # reads is well under it)
    tk, scripts = keys.task("rl"), Scripts(r)
    _stream(r, tk, 40)
    assert burst_of(4.0) == 1
    assert _read(scripts, tk, "a", 4.0, 10)[0] == 1  # a full bucket: the burst, no more
    got, wait = _read(scripts, tk, "b", 4.0, 10)
    assert got == 0 and 1 <= wait <= 250  # empty: the next token in 1/4 s
    assert r.hget(tk.bucket, "empty") is not None  # it held a read back: "limited"
    time.sleep(0.6)
    assert _read(scripts, tk, "a", 4.0, 10)[0] == 1  # refilled by time, capped at the burst
    time.sleep(0.3)
    assert _read(scripts, tk, "b", 4.0, 10)[0] == 1
    idle = keys.task("idle")
    _stream(r, idle, 0)
    assert _read(scripts, idle, "a", 4.0, 10) == (0, 0)  # nothing to read, tokens left:
    assert not r.exists(idle.bucket)  # an idle member's look writes nothing


@pytest.mark.integration
def test_readers_together_never_take_more_than_the_tokens(r: redis.Redis, keys: Keys) -> None:
    tk, scripts = keys.task("rl2"), Scripts(r)
    _stream(r, tk, 500)
    started, taken = time.monotonic(), 0
    while time.monotonic() - started < 0.5:
        for who in ("a", "b", "c"):
            taken += _read(scripts, tk, who, 40.0, 5)[0]
    elapsed = time.monotonic() - started
    assert taken <= burst_of(40.0) + 40.0 * elapsed + 1
    assert taken >= 10  # (and it does read)
    pending = r.xpending(tk.stream, GROUP)["pending"]
    assert pending == taken  # what was read is exactly what was taken


@dataclass
class _Settled:
    """A job as a settle writes it (``scripts.SettledJob``)."""

    entry: JobEntry
    started_at: float = 0.0
    attempt: int = 1
    outcome: str = "1"
    reason: str = ""


def _pump(r: redis.Redis, tk: TaskKeys, limit: int, group: str, back: Sequence[str] = ()) -> int:
    """The pump of ``group`` as its callers run it: its heads read, then the script."""
    return run(r, Scripts(r), plan_pump(tk, limit, {group: limit}, back=back))


def _take(scripts: Scripts, tk: TaskKeys, r: redis.Redis, entry_id: str, limit: int = 2) -> int:
    fields = r.xrange(tk.stream, entry_id, entry_id)[0][1]
    entry = decode_entry(entry_id, fields)
    args = (tk, tk.stream, entry_id, "w1", entry.job_id, "g", limit, 0, entry.named)
    return scripts.group_take(*args)


@pytest.mark.integration
def test_group_slots_are_taken_waited_for_given_back_and_handed_on(
    r: redis.Redis, keys: Keys
) -> None:
    tk, scripts = keys.task("gl"), Scripts(r)
    ids = _stream(r, tk, 3, options='{"group":"g"}')
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"}, count=3)
    assert [_take(scripts, tk, r, i) for i in ids[:2]] == [1, 1]
    assert _take(scripts, tk, r, ids[0]) == 1  # a job that holds one keeps it (a retry)
    assert _take(scripts, tk, r, ids[2]) == 0  # at the limit: it waits, off the stream
    assert r.hget(tk.groups, "g") == b"2" and r.hget(tk.groups_waiting, "g") == b"1"
    assert r.xrange(tk.stream, ids[2], ids[2]) == []
    record = r.hgetall(tk.job(ids[2]))
    assert record[JOB_STATE.encode()] == b"queued" and record[JOB_ENTRY.encode()] == b""
    assert b"group_limit" in record[JOB_WHY.encode()]
    # the first job settles (done): its slot goes back; the pump hands it to the waiting one
    fields = r.xrange(tk.stream, ids[0], ids[0])[0][1]
    batch = JobBatch(ok=[_Settled(decode_entry(ids[0], fields))])
    scripts.settle_jobs(tk, batch, "w1", time.time(), 60, client=None)
    assert r.hget(tk.groups, "g") == b"1" and r.hget(tk.groups_held, ids[0]) is None
    assert _pump(r, tk, 2, "g") == 1
    assert r.hget(tk.groups, "g") == b"2" and r.hget(tk.groups_held, ids[2]) == b"g"
    assert r.hget(tk.groups_waiting, "g") is None
    new = r.hget(tk.job(ids[2]), JOB_ENTRY).decode()  # type: ignore[union-attr]
    back = r.xreadgroup(GROUP, "w2", {tk.stream: ">"})[0][1]
    assert [e.decode() for e, _ in back] == [new]  # back on the stream, attempts counted on
    assert back[0][1][b"j"] == ids[2].encode() and back[0][1][b"a"] == b"0"
    assert _pump(r, tk, 2, "g") == 0  # idempotent
    # a job that gives back a slot it held (cancelled on the stream), by id
    assert _pump(r, tk, 2, "g", back=[ids[2]]) == 0
    assert r.hget(tk.groups, "g") == b"1"


@pytest.mark.integration
def test_the_pump_hands_slots_only_to_the_heads_it_was_given(r: redis.Redis, keys: Keys) -> None:
    tk, scripts = keys.task("gh"), Scripts(r)
    ids = _stream(r, tk, 4, options='{"group":"g"}')
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"}, count=4)
    assert [_take(scripts, tk, r, i, 1) for i in ids] == [1, 0, 0, 0]
    w0, w1, _ = ids[1:]
    # no head given: the slot goes back, no record is touched
    assert scripts.group_pump(tk, 1, {"g": []}, back=[ids[0]]) == 0
    assert r.hget(tk.groups, "g") is None and r.llen(tk.group_wait("g")) == 3
    # the list's head is not among those given (a read older than another pump): it stops
    assert scripts.group_pump(tk, 1, {"g": [w1]}) == 0
    assert r.llen(tk.group_wait("g")) == 3
    assert scripts.group_pump(tk, 1, {"g": [w0, w1]}) == 1  # the head: handed on
    assert r.hget(tk.groups_held, w0) == b"g" and r.hget(tk.job(w0), JOB_ENTRY) != b""
    # a stale read (w0 was handed on already) is passed: its next head is the list's now
    assert scripts.group_pump(tk, 1, {"g": [w0, w1]}, back=[w0]) == 1
    assert r.hget(tk.groups_held, w1) == b"g" and r.llen(tk.group_wait("g")) == 1
    assert r.hget(tk.groups_waiting, "g") == b"1"
    # a member's settle: the heads read last on its pipeline, the pump run after it with
    # the replies of what the settle put there (a slice of the pipe's)
    scripts.group_pump(tk, 1, {"g": []}, back=[w1])
    pipe = r.pipeline(transaction=False)
    pipe.ping()  # (the member's read, before the settle)
    pipe.ping()  # (the settle)
    pump = Pump(pipe, tk, 1, {"g": 1})
    replies = pipe.execute()[1:]
    assert pump.replies(replies) == [True] and pump.run(scripts, replies) == 1
    assert r.llen(tk.group_wait("g")) == 0 and r.hget(tk.groups_waiting, "g") is None


# -- workers (system) ---------------------------------------------------------------------


def _workers(cluster: Cluster, r: redis.Redis, n: int, concurrency: int) -> None:
    cluster.controller()
    fast = ["--heartbeat-interval", "0.2", "--heartbeat-ttl", "0.8"]
    for _ in range(n):
        cluster.worker(allow=ALLOW, extra=["--concurrency", str(concurrency), *fast])
    cluster.wait_workers(r, n)


@pytest.mark.system
def test_a_rate_limit_holds_across_workers_and_blocks_no_other_queue(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    _workers(cluster, r, 2, 5)
    limited = client.queue("limited", rate_limit=40.0, min_nodes=2)
    free = client.queue("free", min_nodes=2)
    log = f"{prefix}:log"
    wait_for(lambda: len(limited.status().nodes) == 2 == len(free.status().nodes), 30, "members")
    slow = limited.enqueue_many((NOTED, {"log": log, "group": "limited"}) for _ in range(40))
    fast = free.enqueue_many((NOTED, {"log": log, "group": "free"}) for _ in range(40))
    assert wait_for(lambda: limited.status().limited, 10, "the queue limited")
    for job in fast + slow:
        job.result(timeout=60)
    starts, _ = read_log(r, log)
    held, other = sorted(starts["limited"]), sorted(starts["free"])
    rate = (len(held) - 1) / (held[-1] - held[0])
    assert 40.0 * 0.6 <= rate <= 40.0 * 1.15  # generous: a loaded machine
    # the free queue never waited for the tokens: it ran at more than twice the limit
    assert other[-1] - other[0] < (held[-1] - held[0]) / 2


@pytest.mark.system
def test_groups_run_at_most_their_limit_and_a_killed_member_gives_its_slot_back(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    _workers(cluster, r, 2, 4)
    q = client.queue("tenants", group_limit=2, min_nodes=2, job_timeout=300.0)
    log = f"{prefix}:log"
    wait_for(lambda: len(q.status().nodes) == 2, 30, "members")
    hog_job = {"log": log, "group": "hog", "seconds": 0.2}
    hog = [q.enqueue(NOTED, hog_job, group="hog") for _ in range(6)]
    others = [
        q.enqueue(NOTED, {"log": log, "group": g, "seconds": 0.05}, group=g)
        for _ in range(4)
        for g in ("a", "b")
    ]
    assert wait_for(lambda: q.status().groups_waiting.get("hog"), 10, "hog jobs waiting")
    for job in others:
        job.result(timeout=60)
    assert len(read_log(r, log)[0]["hog"]) < 6  # a and b never waited for hog's slots
    for job in hog:
        job.result(timeout=60)
    _, peaks = read_log(r, log)
    assert peaks["hog"] == 2 and max(peaks.values()) == 2  # never more than the limit
    status = q.status()
    assert (status.groups_running, status.groups_waiting, status.done) == ({}, {}, 14)
    # a member killed while running a group's job: its slot comes back with the job
    hangs = q.enqueue("tests.handlers_flow:hangs_first", {"log": log}, group="k")
    first = wait_for(lambda: r.lrange(f"{log}:attempts", 0, -1), 30, "the first attempt")
    worker = first[0].decode().split("|")[1]
    assert q.status().groups_running == {"k": 1}
    victim = next(p for p in cluster.procs if p.name == worker)
    victim.kill()
    assert hangs.result(timeout=30) == 2  # reclaimed, run again, holding the same slot
    after = q.enqueue(NOTED, {"log": log, "group": "k"}, group="k")
    assert after.result(timeout=30) == "k"
    status = q.status()
    assert (status.groups_running, status.groups_waiting) == ({}, {})


@pytest.mark.integration
def test_cancelling_a_job_that_waits_for_a_slot_or_holds_one_gives_it_up(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("gc", group_limit=1)
    tk, scripts = keys.task("gc"), Scripts(r)
    first, waiting = (q.enqueue(NOTED, {"i": i}, group="g") for i in range(2))
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    assert [_take(scripts, tk, r, j.id, 1) for j in (first, waiting)] == [1, 0]
    status = waiting.status()
    assert status.state == "queued" and "group 'g'" in (status.reason or "")
    assert waiting.detail().options == {"group": "g"}
    assert q.status().groups_waiting == {"g": 1} and q.status().groups_running == {"g": 1}
    assert waiting.cancel() is True and waiting.status().state == "cancelled"
    assert _pump(r, tk, 1, "g", back=[first.id]) == 0  # passed over
    assert q.status().groups_waiting == {} and q.status().groups_running == {}
    # a job handed a slot, back on the stream, cancelled before a member read it
    held, handed = (q.enqueue(NOTED, {"i": i}, group="g") for i in range(2))
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    assert [_take(scripts, tk, r, j.id, 1) for j in (held, handed)] == [1, 0]
    assert _pump(r, tk, 1, "g", back=[held.id]) == 1
    assert q.status().groups_running == {"g": 1}
    assert handed.cancel() is True
    assert q.status().groups_running == {}


@pytest.mark.integration
def test_jobs_waiting_for_a_slot_are_listed_queued_and_counted_in_the_backlog(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("gq", group_limit=1)
    tk, scripts = keys.task("gq"), Scripts(r)
    jobs = [q.enqueue(NOTED, {"i": i}, group=g) for i, g in enumerate("ggghh")]
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    took = [
        scripts.group_take(tk, tk.stream, j.id, "w1", j.id, g, 1, 0, False)
        for j, g in zip(jobs, "ggghh", strict=True)
    ]
    assert took == [1, 0, 0, 1, 0]
    unread = q.enqueue(NOTED, {"i": 9})  # on the stream, read by no member yet
    want = [unread.id, jobs[1].id, jobs[2].id, jobs[4].id]  # the stream's, then g's, then h's
    page = q.jobs("queued")
    assert page.total == 4 and [j.id for j in page.jobs] == want
    assert {j.state for j in page.jobs} == {"queued"}
    assert "group 'g'" in (page.jobs[1].reason or "") and page.jobs[1].handler == NOTED
    detail = jobs[2].detail()  # its payload, kept on its group's wait list
    assert json.loads(detail.payload or "") == {"i": 2} and detail.options == {"group": "g"}
    assert [j.id for j in q.jobs("queued", limit=2, offset=1).jobs] == want[1:3]
    assert [j.id for j in q.jobs("queued", limit=5, offset=3).jobs] == want[3:]
    assert q.status().backlog == 4
    assert jobs[2].cancel() is True  # cancelled where it waits: counted out at once
    assert q.status().backlog == 3 and q.status().groups_waiting == {"g": 1, "h": 1}
    page = q.jobs("queued")
    assert page.total == 3 and [j.id for j in page.jobs] == [want[0], want[1], want[3]]
    with make_app(client) as web:
        assert web.get("/api/queues/gq").json()["queue"]["backlog"] == 3
        listed = web.get("/api/queues/gq/jobs", params={"state": "queued"}).json()
        assert listed["total"] == 3 and len(listed["jobs"]) == 3
    # the pump hands g's slot on; the cancelled job keeps its place (the hash names the
    # list, counting 0) until a pump passes it over: then the list and its name go
    assert _pump(r, tk, 1, "g", back=[jobs[0].id]) == 1
    assert q.status().backlog == 3  # jobs[1] is back on the stream, holding g's slot
    assert r.hget(tk.groups_waiting, "g") == b"0" and r.llen(tk.group_wait("g")) == 1
    assert _pump(r, tk, 1, "g", back=[jobs[1].id]) == 0
    assert r.hget(tk.groups_waiting, "g") is None and not r.exists(tk.group_wait("g"))


@pytest.mark.integration
def test_emptying_a_queue_cancels_the_jobs_waiting_for_a_slot_too(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("ge", group_limit=1)
    tk, scripts = keys.task("ge"), Scripts(r)
    jobs = [q.enqueue(NOTED, {"i": i}, group="g", key=f"k{i}") for i in range(3)]
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    assert [_take(scripts, tk, r, j.id, 1) for j in jobs] == [1, 0, 0]
    unread = q.enqueue(NOTED, {"i": 9})
    assert q.status().backlog == 3
    assert q.empty() == 3  # the unread one and the two waiting; the running one runs on
    assert [j.status().state for j in (*jobs, unread)] == ["running", *["cancelled"] * 3]
    assert q.status().backlog == 0 and q.jobs("queued").total == 0
    assert not r.exists(tk.unique("k1"))  # a cancelled waiting job's unique key is freed
    assert _pump(r, tk, 1, "g", back=[jobs[0].id]) == 0  # both passed over
    assert not r.exists(tk.group_wait("g")) and not r.exists(tk.groups_waiting)


@pytest.mark.integration
def test_enqueue_many_gives_every_job_its_group(
    client: Client, r: redis.Redis, keys: Keys, redis_url: str, prefix: str
) -> None:
    q = client.queue("gm", group_limit=1)
    tk, scripts = keys.task("gm"), Scripts(r)
    with pytest.raises(ValueError, match="group"):
        q.enqueue_many([(NOTED, {"i": 0})], group="a\tb")
    assert q.status().backlog == 0  # checked before any job was sent
    jobs = q.enqueue_many(((NOTED, {"i": i}) for i in range(3)), group="g")

    async def more() -> list[str]:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as aclient:
            aq = await aclient.queue("gm")
            with pytest.raises(ValueError, match="group"):
                await aq.enqueue_many([(NOTED, {})], group="")
            added = await aq.enqueue_many([(NOTED, {"i": i}) for i in range(2)], group="h")
            plain = await aq.enqueue_many([(NOTED, {})])
            return [j.id for j in added + plain]

    ids = [j.id for j in jobs] + asyncio.run(more())
    assert [q.job(i).detail().options for i in ids] == [{"group": "g"}] * 3 + [
        {"group": "h"}
    ] * 2 + [{}]
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    # each entry carries its group: a member takes the group's slot from it
    for job_id, want in zip(ids[:5], [1, 0, 0, 1, 0], strict=True):
        entry = decode_entry(job_id, r.xrange(tk.stream, job_id, job_id)[0][1])
        group = JobOptions.parse(entry.options).group
        assert group is not None
        assert scripts.group_take(tk, tk.stream, job_id, "w1", job_id, group, 1, 0, False) == want
    assert q.status().groups_waiting == {"g": 2, "h": 1}


def _leader(r: redis.Redis, keys: Keys) -> tuple[Reconciler, Feed]:
    """A controller's reconciler and feed in this process, fenced by a lease it holds."""
    scripts, tally = Scripts(r), Tally()
    term, token = scripts.lease_acquire(keys.leader, keys.leader_term, "test", 60_000)
    fence = Fence(r, keys, scripts, tally)
    fence.arm(token, term)
    rec = Reconciler(
        r,
        keys,
        fence,
        get_logger(),
        me="test",
        heartbeat_ttl=3.0,
        full_pass_interval=60.0,
        tally=tally,
    )
    feed = Feed(r, keys, "test", tally)
    feed.start()
    rec.rebuild()
    return rec, feed


@pytest.mark.integration
def test_a_finished_queue_takes_its_wait_lists_and_slots_with_it(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("gx", group_limit=1, result_ttl=0.5)
    tk, scripts = keys.task("gx"), Scripts(r)
    rec, feed = _leader(r, keys)
    jobs = [q.enqueue(NOTED, {"i": i}, group=g) for i, g in enumerate("gghhkk")]
    rec.step(feed.read(100))  # the leader knows the queue as it was before its jobs waited
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    groups = "gghhkk"
    took = [
        scripts.group_take(tk, tk.stream, j.id, "w1", j.id, g, 1, 0, False)
        for j, g in zip(jobs[:4], groups, strict=False)
    ]
    assert took == [1, 0, 1, 0]
    flow = [tk.groups, tk.groups_held, tk.groups_waiting, *tk.group_waits("gh")]
    assert q.task.cancel()
    rec.step(feed.read(100))  # the leader releases it: its keys expire, the wait lists too
    assert all(0 < r.pttl(k) <= 500 for k in flow)
    # reopened before they expired: they are kept again
    q = client.queue("gx", reopen=True)
    assert all(r.pttl(k) == -1 for k in flow)
    assert q.task.cancel()
    rec.step(feed.read(100))
    assert all(0 < r.pttl(k) <= 500 for k in flow)
    # a job that starts waiting on a queue that just finished: its list expires with it
    k_first, k_next = jobs[4:]
    assert scripts.group_take(tk, tk.stream, k_first.id, "w1", k_first.id, "k", 1, 0, False)
    assert scripts.group_take(tk, tk.stream, k_next.id, "w1", k_next.id, "k", 1, 0, False) == 0
    assert 0 < r.pttl(tk.group_wait("k")) <= 500
    left = [*flow, tk.group_wait("k"), tk.record]
    assert wait_for(lambda: not r.exists(*left), 5, "the queue's keys gone")


@pytest.mark.integration
def test_limits_and_groups_show_in_the_dashboard_metrics_and_info(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("shown", group_limit=1, rate_limit=5)
    tk, scripts = keys.task("shown"), Scripts(r)
    running, waiting = (q.enqueue(NOTED, {"i": i}, group="t<7>") for i in range(2))
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    for job in (running, waiting):
        scripts.group_take(tk, tk.stream, job.id, "w1", job.id, "t<7>", 1, 0, False)
    assert scripts.rate_read(tk, [tk.stream], "w1", 5.0, 3)[0] == []  # nothing to read:
    assert q.status().limited is False  # tokens were left, nothing was held back

    def held_back() -> None:  # as a read held back just now ("limited" for 1 s: set it anew)
        r.hset(tk.bucket, "empty", int(time.time() * 1000))

    held_back()
    status = q.status()
    assert (status.rate_limit, status.group_limit, status.limited) == (5.0, 1, True)
    assert (status.groups_running, status.groups_waiting) == ({"t<7>": 1}, {"t<7>": 1})
    assert _queues([status], {}, {}, time.time())[2:4] == [
        "      rate_limit=5/s (limited now)",
        "      group_limit=1 running+waiting: t<7>=1+1",
    ]
    with make_app(client) as web:
        held_back()
        detail = web.get("/api/queues/shown").json()
        assert (detail["rate_limit"], detail["group_limit"]) == (5.0, 1)
        queue = detail["queue"]
        assert queue["limited"] and queue["groups_waiting"] == {"t<7>": 1}
        held_back()
        page = web.get("/queues/shown").text
        assert 'id="queue-limited"' in page and "<td>t&lt;7&gt;</td>" in page
        assert "at most 5 job(s) started per second" in page
        held_back()
        values = metric_values(web.get("/metrics").text)
    group = (("group", "t<7>"), ("queue", "shown"))
    assert values[("queueworks_queue_group_running", group)] == 1
    assert values[("queueworks_queue_group_waiting", group)] == 1
    assert values[("queueworks_queue_limited", (("queue", "shown"),))] == 1


@pytest.mark.integration
def test_the_backstop_frees_slots_of_finished_or_vanished_jobs(r: redis.Redis, keys: Keys) -> None:
    tk, scripts = keys.task("sw"), Scripts(r)
    ids = _stream(r, tk, 3, options='{"group":"g"}')
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    assert [_take(scripts, tk, r, i, 3) for i in ids] == [1, 1, 1]
    r.hset(tk.job(ids[0]), JOB_STATE, "done")  # settled, its slot not given back
    r.xdel(tk.stream, ids[1])  # deleted while pending: it never settles
    _, freed = sweep_held(r, scripts, tk, 3, 0)
    assert sorted(freed) == sorted(ids[:2])
    assert r.hget(tk.groups, "g") == b"1" and r.hkeys(tk.groups_held) == [ids[2].encode()]
    assert sweep_held(r, scripts, tk, 3, 0)[1] == []  # the running one keeps its slot


@pytest.mark.integration
def test_the_enqueue_command_takes_a_group_and_the_limits(
    redis_url: str, prefix: str, client: Client
) -> None:
    base = ["enqueue", "cmd", NOTED, "--json", "{}", "--rate-limit", "2.5", "--group-limit", "3"]
    res = cli([*base, "--group", "tenant-7"], redis_url, prefix)
    assert res.returncode == 0, res.stderr
    q = client.queue("cmd")
    assert q.job(res.stdout.strip()).detail().options == {"group": "tenant-7"}
    assert (q.status().rate_limit, q.status().group_limit) == (2.5, 3)
    one_line_error(cli([*base, "--group", "a\tb"], redis_url, prefix), 2, "group", "control")
    one_line_error(cli([*base[:5], "--rate-limit", "0"], redis_url, prefix), 2, "rate")
