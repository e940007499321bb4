"""One bad job is the job's problem: a job whose handler cannot be imported is dead alone,
with the reason named; one whose handler no member may run waits alone, with its reason,
while the queue's other jobs run, and runs once a worker that may comes (or is cancelled
without a trace); a queue is never failed by its jobs; a cancelled queue can be reopened.
Real Redis, real worker and controller processes, real SIGKILLs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis

from queueworks import AsyncClient, Client, TaskState
from queueworks.controller.allocator import (
    Snapshot,
    TaskView,
    WorkerView,
    allocate,
    matches,
    why_waiting,
)
from queueworks.errors import JobFailed
from queueworks.protocol import events
from queueworks.protocol.keys import Keys
from queueworks.protocol.models import UNUSABLE, JobState, Refusal
from queueworks.scripts.bound import Scripts
from tests.conftest import Cluster, wait_for
from tests.test_cli import cli, one_line_error


def results_of(jobs: list[Any], timeout: float = 60.0) -> list[Any]:
    return [j.result(timeout=timeout) for j in jobs]


def joins_and_leaves(r: redis.Redis, keys: Keys, queue: str) -> list[tuple[str, str]]:
    return [
        (f[b"cause"].decode(), f.get(b"worker", b"").decode())
        for _, f in r.xrange(keys.task(queue).history)
        if f[b"cause"] in (b"join", b"leave")
    ]


@pytest.mark.system
def test_a_job_whose_module_is_missing_is_dead_alone_and_the_queue_goes_on(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, redis_url: str, prefix: str
) -> None:
    """A module under an allowed prefix that does not exist: that job is dead at once with
    the reason, the 20 jobs before and the 20 after it run, the queue stays open, the
    member never leaves, and ``enqueue --wait`` of such a job exits 3 saying why."""
    cluster.controller()
    cluster.worker("w", allow=("tests",))
    cluster.wait_workers(r, 1)
    q = client.queue("mixed")
    before = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(20)]
    bad = q.enqueue("tests.nowhere:square", {"x": 1})
    after = [q.enqueue("tests.handlers:square", {"x": i}) for i in range(20)]
    with pytest.raises(JobFailed) as failed:
        bad.result(timeout=30)
    reason = failed.value.reason
    assert reason == (
        "handler 'tests.nowhere:square': cannot import 'tests.nowhere': "
        "ModuleNotFoundError: No module named 'tests.nowhere'"
    ), reason
    assert results_of(before) == [2 * i for i in range(20)]
    assert results_of(after) == [i * i for i in range(20)]
    st = bad.status()
    assert st.state == JobState.DEAD and st.attempts == 1  # dead at once: no retry
    assert st.error and st.error.startswith(reason)
    wait_for(lambda: q.status().state == TaskState.RUNNING, 15, "the queue running")
    status = q.status()
    assert (status.done, status.dead) == (40, 1)
    assert [n.worker for n in status.nodes] == ["w"] and not status.reason
    assert r.hlen(keys.task("mixed").refused) == 0
    assert joins_and_leaves(r, keys, "mixed") == [("join", "w")]  # it never left
    # the open handle, and a new one, take jobs that run
    assert q.enqueue("tests.handlers:double", {"x": 50}).result(timeout=15) == 100
    assert client.queue("mixed").enqueue("tests.handlers:square", {"x": 5}).result(15) == 25
    res = cli(
        ["enqueue", "mixed", "tests.nowhere:square", "--json", '{"x": 2}', "--wait"],
        redis_url,
        prefix,
    )
    assert res.returncode == 3, (res.stdout, res.stderr)
    (job_id,) = res.stdout.split()
    assert res.stderr.strip() == f"job {job_id}: {reason}"
    letters = r.xrange(keys.task("mixed").dead)
    assert [f[b"reason"].decode() for _, f in letters] == [reason, reason]
    assert client.task("mixed").status().state == TaskState.RUNNING


@pytest.mark.system
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_job_no_member_may_run_waits_alone_and_runs_once_a_worker_may(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, concurrency: int
) -> None:
    """A job whose handler the queue's only worker may not run waits alone, saying why,
    while the jobs before and after it run on that worker, which keeps the queue; a worker
    that may run it starts: it runs there, once (one job at a time, or four)."""
    cluster.controller()
    extra = ["--concurrency", str(concurrency)]
    cluster.worker("narrow", allow=("tests.handlers",), extra=extra)
    cluster.wait_workers(r, 1)
    q = client.queue("picky")
    before = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(20)]
    other = q.enqueue("queueworks.examples:double", {"x": 21})
    after = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(20, 40)]
    assert results_of(before + after) == [2 * i for i in range(40)]
    wait_for(lambda: other.status().reason, 15, "the waiting job's reason")
    st = other.status()
    assert st.state == JobState.QUEUED and st.attempts == 0, st
    assert st.reason == (
        "no member may run 'queueworks.examples:double': handler "
        "'queueworks.examples:double' is outside the allowed module prefixes ['tests.handlers']"
    )
    # (the jobs ran on the worker's own; the state is the controller's word, soon after)
    wait_for(lambda: q.status().state == TaskState.RUNNING, 15, "the queue running")
    status = q.status()
    assert [n.worker for n in status.nodes] == ["narrow"]
    assert status.reason == set_aside_reason("queueworks.examples:double", 1)  # theirs alone
    assert (status.done, status.dead, status.backlog) == (40, 0, 1)
    assert results_of([q.enqueue("tests.handlers:double", {"x": 7}) for _ in range(5)]) == [14] * 5
    with pytest.raises(TimeoutError, match="queued"):
        other.result(timeout=0.5)

    cluster.worker("wide", allow=("queueworks.examples",), extra=extra)
    assert other.result(timeout=30) == 42
    st = other.status()
    assert (st.state, st.attempts, st.worker, st.reason) == (JobState.DONE, 1, "wide", None)
    status = q.status()
    assert (status.done, status.dead, status.backlog) == (46, 0, 0)
    tk = keys.task("picky")
    assert r.smembers(tk.aside) == set()  # nothing waits aside any more
    assert not r.exists(tk.aside_stream("queueworks.examples:double"))
    assert ("leave", "narrow") not in joins_and_leaves(r, keys, "picky")


@pytest.mark.system
def test_cancelling_a_job_nobody_may_run_leaves_no_trace(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, redis_url: str, prefix: str
) -> None:
    """``os:system`` (allowed nowhere) waits alone while good jobs run; cancelled (with the
    sync and the asyncio client alike), nothing of it is left in what sizes the queue or
    in its reason, and the queue goes on."""
    cluster.controller()
    cluster.worker("narrow", allow=("tests.handlers",))
    cluster.wait_workers(r, 1)
    q = client.queue("careful")
    bad = q.enqueue("os:system", "echo owned")
    worse = q.enqueue("os:system", "echo owned twice")
    good = [q.enqueue("tests.handlers:double", {"x": i}) for i in range(20)]
    assert results_of(good) == [2 * i for i in range(20)]
    tk = keys.task("careful")
    wait_for(lambda: worse.status().reason, 15, "the waiting jobs' reason")
    assert r.smembers(tk.aside) == {b"os:system"} and r.xlen(tk.aside_stream("os:system")) == 2
    assert "'os:system'" in (bad.status().reason or "")
    # (the state and the reason are the controller's word, soon after the member joined)
    wait_for(lambda: q.status().state == TaskState.RUNNING, 15, "the queue running")
    status = q.status()
    assert [n.worker for n in status.nodes] == ["narrow"]
    assert status.reason == set_aside_reason("os:system", 2) and status.backlog == 2

    assert bad.cancel()
    assert bad.status().state == JobState.CANCELLED and bad.status().reason is None
    with pytest.raises(JobFailed, match="cancelled"):
        bad.result(timeout=1)
    assert not bad.cancel()
    assert r.smembers(tk.aside) == {b"os:system"}  # the other one still waits

    async def cancel_the_other() -> tuple[Any, bool, Any]:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            aq = await ac.queue("careful")
            waiting = await aq.job(worse.id).status()
            return waiting, await aq.job(worse.id).cancel(), await aq.job(worse.id).status()

    waiting, done, after = asyncio.run(cancel_the_other())
    assert waiting.state == JobState.QUEUED
    bad_reason(waiting.reason)
    assert done and after.state == JobState.CANCELLED
    assert r.smembers(tk.aside) == set() and not r.exists(tk.aside_stream("os:system"))
    assert b"os:system" not in r.smembers(tk.handlers)
    assert results_of([q.enqueue("tests.handlers:double", {"x": 3})]) == [6]
    status = q.status()
    assert (status.done, status.dead, status.backlog, status.running) == (21, 0, 0, 0)
    assert not status.reason and [n.worker for n in status.nodes] == ["narrow"]
    assert joins_and_leaves(r, keys, "careful") == [("join", "narrow")]


def set_aside_reason(handler: str, n: int) -> str:
    """A queue's reason while ``n`` jobs of ``handler`` wait set aside (its only one)."""
    return f"{n} job(s) of {handler!r} set aside, waiting for a member that may run their handler"


def bad_reason(reason: str | None) -> None:
    assert reason and reason.startswith("no member may run 'os:system': "), reason


@pytest.mark.system
def test_a_member_killed_holding_a_set_aside_job_loses_nothing(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys
) -> None:
    """A job set aside (its handler is outside the first member's --allow) is run by a
    worker that may run it; SIGKILLed mid-job, the job runs again on the next such worker,
    charged (attempt 2), and is counted once."""
    cluster.controller()
    cluster.worker("narrow", allow=("tests.handlers",))
    cluster.wait_workers(r, 1)
    q = client.queue("sturdy")
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=15) == 2
    slow = q.enqueue("queueworks.examples:sleep", {"seconds": 4})
    wait_for(lambda: slow.status().reason, 15, "the job set aside")
    first = cluster.worker("wide-1", allow=("queueworks.examples",))
    wait_for(lambda: slow.status().state == JobState.RUNNING, 20, "the job running")
    assert slow.status().worker == "wide-1"
    first.kill()
    cluster.worker("wide-2", allow=("queueworks.examples",))
    assert slow.result(timeout=40) == 4.0
    st = slow.status()
    assert (st.state, st.attempts, st.worker) == (JobState.DONE, 2, "wide-2"), st
    status = q.status()
    assert (status.done, status.dead, status.rejected) == (2, 0, 0)
    tk = keys.task("sturdy")
    assert r.smembers(tk.aside) == set()
    assert not r.exists(tk.aside_stream("queueworks.examples:sleep"))


@pytest.mark.system
def test_a_cancelled_queue_is_reopened_on_request_and_runs_jobs(
    cluster: Cluster, client: Client, r: redis.Redis, keys: Keys, redis_url: str, prefix: str
) -> None:
    """Opening a cancelled (or, from an older version, failed) queue says how to reopen it;
    ``reopen=True`` (``Client``, ``AsyncClient``) or ``enqueue --reopen`` makes it open
    again, with its settings and counts, and its jobs run."""
    cluster.controller()
    cluster.worker()
    cluster.wait_workers(r, 1)
    q = client.queue("again", max_attempts=2)
    tk = keys.task("again")
    assert q.enqueue("tests.handlers:double", {"x": 1}).result(timeout=15) == 2

    def released() -> bool:
        return r.zscore(keys.queue, "again") is None and r.pttl(tk.record) > 0

    assert q.task.cancel()
    wait_for(released, 15, "the cancelled queue released")
    with pytest.raises(ValueError, match=r"was cancelled; it takes no jobs .*reopen=True"):
        client.queue("again")
    with pytest.raises(ValueError, match="exists with max_attempts=2"):
        client.queue("again", max_attempts=3, reopen=True)  # the settings still must match
    again = client.queue("again", reopen=True)
    assert again.settings.max_attempts == 2 and r.pttl(tk.record) == -1
    assert again.enqueue("tests.handlers:double", {"x": 2}).result(timeout=30) == 4
    # (the job ran on the worker's own; the state is the controller's word, soon after)
    wait_for(lambda: again.status().state == TaskState.RUNNING, 15, "the queue running")
    status = again.status()
    assert status.done == 2 and status.nodes
    assert client.queue("again", reopen=True).status().state == TaskState.RUNNING  # a no-op

    # a queue an older version failed (every worker refused it): reopened the same way
    scripts = Scripts(r)
    assert scripts.set_state(tk, TaskState.FAILED, 0.0, "no worker can run it: ...")
    events.emit(r, keys, "failed", task="again")
    wait_for(released, 15, "the failed queue released")

    async def reopen() -> Any:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            with pytest.raises(ValueError, match="was failed; it takes no jobs"):
                await ac.queue("again")
            aq = await ac.queue("again", reopen=True)
            return await (await aq.enqueue("tests.handlers:double", {"x": 3})).result(30)

    assert asyncio.run(reopen()) == 6
    wait_for(lambda: client.queue("again").status().state == TaskState.RUNNING, 15, "running")
    assert client.queue("again").status().done == 3
    assert client.task("again").status().error is None

    # the command line: enqueue says how, --reopen does it
    assert q.task.cancel()
    wait_for(released, 15, "the queue released again")
    args = ["enqueue", "again", "tests.handlers:double", "--json", '{"x": 4}', "--wait"]
    one_line_error(cli(args, redis_url, prefix), 2, "was cancelled", "--reopen")
    res = cli([*args, "--reopen"], redis_url, prefix)
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert res.stdout.split()[1] == "8"


@pytest.mark.unit
def test_a_queue_fits_a_worker_that_may_run_one_of_its_handlers() -> None:
    """The allocator's rule, without Redis: one handler nobody may run does not keep a queue
    from the workers that may run its others; a queue none of whose handlers any worker
    may run waits, naming them; a queue never fails for refusals, a task still does."""
    queue = TaskView("q", 0, 1, None, 0.0, handlers=("a.jobs:ok", "os:system"))
    narrow, other = WorkerView("narrow", allow=("a",)), WorkerView("other", allow=("b",))
    assert matches(narrow, queue) and not matches(other, queue)
    assert matches(other, TaskView("new", 0, 1, None, 0.0))  # names no handler yet
    plan = allocate(Snapshot((queue,), (narrow, other)))
    assert plan.assignment == {"narrow": "q", "other": None}
    reason, never = why_waiting(queue, [other], {})
    assert reason == (
        "no live worker may run any of 'a.jobs:ok', 'os:system': their --allow prefixes are b"
    )
    assert not never
    unusable = Refusal(reason="cannot import", kind=UNUSABLE, since=0.0)
    assert why_waiting(queue, [narrow], {"narrow": unusable})[1] is False
    task = TaskView("t", 0, 1, None, 0.0, handler="a.jobs:ok")
    assert why_waiting(task, [narrow], {"narrow": unusable})[1] is True
    assert not matches(narrow, TaskView("t2", 0, 1, None, 0.0, handler="os:system"))
