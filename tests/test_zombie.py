"""A worker frozen past its heartbeat TTL (SIGSTOP) is pruned and its job runs again on
another member, holding the same group slot. When it resumes it finds itself fenced and
stops the handler it still runs before anything of that job is settled: an ``async def``
one at once (cancelled), a plain one at its next ``ctx.checkpoint()`` (an exception its
``except Exception`` does not catch), and a plain one that cannot be asked (no context) by
the worker's exit. So a queue's ``group_limit`` holds across the freeze: the group's next
job starts only once every run of the one before has ended. And whatever the zombie ran, a
settle of it finds the member pruned and writes nothing (no ack, no result, no slot back)."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from queueworks import Client, Fenced, JobContext, Role
from queueworks.logs import get_logger
from queueworks.protocol.jobrecords import JobEntry, decode_entry
from queueworks.protocol.keys import GROUP, Keys
from queueworks.scripts.bound import JobBatch, Scripts
from queueworks.workers.eventloop import EventLoop
from queueworks.workers.heartbeat import NodeState
from queueworks.workers.running_job import RunningJob
from queueworks.workers.stopping import Running
from queueworks.workers.watchdog import EXIT_HUNG, Watchdog
from queueworks.workers.work import Work
from tests.conftest import Cluster, Proc, wait_for
from tests.handlers_zombie import runs
from tests.test_flow import _Settled, _stream, _take

ALLOW = ("tests.handlers_zombie",)
INTERVAL, TTL = 0.25, 1.0  # the workers' heartbeat: a freeze of FROZEN s is well past it
FROZEN = 2.5
SOON = 1.0  # s after SIGCONT by which the zombie's handler has stopped (it takes a tick)

Runs = dict[tuple[str, int], tuple[float, float]]  # (job, pid) -> (first note, last note)


def _freeze_the_groups_job(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str, handler: str, concurrency: int
) -> tuple[Proc, float, Runs]:
    """Two workers, a queue with ``group_limit=1`` and two jobs of one group; the worker
    running the first is frozen past its TTL, then resumed while the first job's reclaimed
    attempt runs. Returns the zombie, when it resumed, and the runs once both jobs are done."""
    cluster.controller()
    beat = ["--heartbeat-interval", str(INTERVAL), "--heartbeat-ttl", str(TTL)]
    extra = [*beat, "--concurrency", str(concurrency)]
    workers = [cluster.worker(allow=ALLOW, extra=extra) for _ in range(2)]
    cluster.wait_workers(r, 2)
    q = client.queue("frozen", group_limit=1, min_nodes=2, job_timeout=60.0)
    wait_for(lambda: len(q.status().nodes) == 2, 30, "both workers members")
    log = f"{prefix}:log"
    first = q.enqueue(handler, {"log": log, "name": "first", "ticks": 80}, group="g")  # 4 s
    wait_for(lambda: len(r.lrange(log, 0, -1)) >= 5, 30, "the first job running a while")
    after = q.enqueue(handler, {"log": log, "name": "next", "ticks": 10}, group="g")
    ((_, pid),) = runs(r, log)
    zombie = next(w for w in workers if w.pid == pid)
    zombie.signal(signal.SIGSTOP)
    frozen_at = time.time()
    wait_for(lambda: len(runs(r, log)) == 2, 15, "the first job reclaimed and run again")
    time.sleep(max(0.0, frozen_at + FROZEN - time.time()))
    resumed_at = time.time()
    zombie.signal(signal.SIGCONT)
    assert first.result(timeout=30) == "first"
    assert after.result(timeout=30) == "next"
    assert first.status().worker != zombie.name  # nothing of the zombie's was settled
    return zombie, resumed_at, runs(r, log)


def _assert_held(zombie: Proc, resumed_at: float, ran: Runs) -> None:
    stopped = ran[("first", zombie.pid)][1]
    assert stopped < resumed_at + SOON, f"the zombie's handler ran {stopped - resumed_at:.2f} s on"
    firsts = [span for (name, _), span in ran.items() if name == "first"]
    nexts = [span for (name, _), span in ran.items() if name == "next"]
    assert len(firsts) == 2 and len(nexts) == 1, ran
    # the group's next job started only once every run of the first had ended
    assert nexts[0][0] > max(end for _, end in firsts), ran


@pytest.mark.system
@pytest.mark.parametrize("concurrency", [1, 3])
def test_an_async_handler_of_a_fenced_worker_is_cancelled_at_once(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str, concurrency: int
) -> None:
    handler = "tests.handlers_zombie:ticking_async"
    zombie, resumed_at, ran = _freeze_the_groups_job(
        cluster, client, r, prefix, handler, concurrency
    )
    _assert_held(zombie, resumed_at, ran)
    assert zombie.alive()  # it rejoined


@pytest.mark.system
def test_a_plain_handler_of_a_fenced_worker_stops_at_its_checkpoint(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    handler = "tests.handlers_zombie:ticking_checked"
    zombie, resumed_at, ran = _freeze_the_groups_job(cluster, client, r, prefix, handler, 2)
    _assert_held(zombie, resumed_at, ran)
    assert zombie.alive()


@pytest.mark.system
def test_a_fenced_worker_whose_plain_handler_cannot_stop_exits(
    cluster: Cluster, client: Client, r: redis.Redis, prefix: str
) -> None:
    handler = "tests.handlers_zombie:ticking_plain"
    zombie, resumed_at, ran = _freeze_the_groups_job(cluster, client, r, prefix, handler, 1)
    _assert_held(zombie, resumed_at, ran)
    assert zombie.p.wait(10) == EXIT_HUNG  # for its supervisor to start a fresh one


@pytest.mark.integration
def test_a_pruned_member_settles_nothing_of_what_it_ran(r: redis.Redis, keys: Keys) -> None:
    """Its job ended as it resumed, before it learnt it was pruned: the settle (done, or a
    retry that waits) finds it is no longer one of the queue's members and writes nothing;
    the member that reclaimed the job settles it."""
    tk, scripts = keys.task("fz"), Scripts(r)
    (entry_id,) = _stream(r, tk, 1, options='{"group":"g"}')
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    r.zadd(tk.members, {"w1": 1, "w2": 2})
    assert _take(scripts, tk, r, entry_id, 1) == 1
    job = _Settled(decode_entry(entry_id, r.xrange(tk.stream, entry_id, entry_id)[0][1]))
    r.zrem(tk.members, "w1")  # pruned; w2 reclaims the job and runs it
    r.xclaim(tk.stream, GROUP, "w2", 0, [entry_id])
    now, fence = time.time(), tk.members
    done = scripts.settle_jobs(tk, JobBatch(ok=[job]), "w1", now, 60, None, fence=fence)
    later = scripts.retry_later(tk, [(job, now + 60, "tb")], "w1", now, None, fence=fence)
    assert (list(done), list(later)) == ([0, 0, 0, 0, 1], [0, 0, 1])  # fenced: nothing
    assert r.xpending_range(tk.stream, GROUP, "-", "+", 10)[0]["consumer"] == b"w2"
    assert r.hget(tk.groups, "g") == b"1" and r.hget(tk.groups_held, entry_id) == b"g"
    assert not r.exists(tk.job(entry_id)) and r.zcard(tk.scheduled) == 0
    done = scripts.settle_jobs(tk, JobBatch(ok=[job]), "w2", now, 60, None, fence=fence)
    assert list(done) == [1, 0, 0, 0]
    assert r.hget(tk.groups, "g") is None and r.xlen(tk.stream) == 0


@pytest.mark.integration
def test_a_fence_stops_only_the_jobs_that_run_elsewhere_now(r: redis.Redis, keys: Keys) -> None:
    """What a fence stops: a job another member claimed, or one settled meanwhile; not one
    still pending on us (no member reclaimed it: nobody else runs it), nor one whose stream
    is gone (an emptied Redis: nobody runs it again either)."""
    tk = keys.task("fs")
    ids = _stream(r, tk, 3)
    r.xreadgroup(GROUP, "w1", {tk.stream: ">"})
    log = get_logger()
    running = Running(r, "w1", EventLoop(), Watchdog(log), log)
    seat = NodeState("w1").seat("fs", queue=True)
    jobs = []
    for entry_id in [*ids, "1-1"]:
        stream = tk.stream if entry_id != "1-1" else keys.task("gone").stream
        work = Work(stream, entry_id, {}, 1)
        job = RunningJob(
            work, JobEntry(entry_id, entry_id, "m:f", "{}", "", False, ""), print, (), 0
        )
        job.ctx = JobContext("fs", entry_id, 1, Role(0, 1, 1), "w1", log)
        running.started(seat, job)
        jobs.append(job)
    r.xclaim(tk.stream, GROUP, "w2", 0, [ids[0]])  # reclaimed by w2
    r.xack(tk.stream, GROUP, ids[1])  # settled by another
    running.fenced(seat.key)
    assert [isinstance(j.stop, Fenced) for j in jobs] == [True, True, False, False]
    with pytest.raises(Fenced):
        jobs[0].ctx.checkpoint()  # type: ignore[union-attr]
    jobs[2].ctx.checkpoint()  # type: ignore[union-attr]
    for job in jobs:
        running.ended(job)
