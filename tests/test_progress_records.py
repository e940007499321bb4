"""A job's progress in Redis (``ctx.progress``, ``workers.progress``, ``job_progress.lua``):
its checks, the partial record of a job to run now that reports before it settles (status,
result, cancel and the settle read and write it right), its expiry, and how reports are
coalesced. Real Redis; a member played by hand, the worker's own writer and scripts."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from queueworks import Client
from queueworks.context import JobContext, call_ended, checked_progress
from queueworks.protocol.jobrecords import JobEntry, decode_entry
from queueworks.protocol.keys import Keys, TaskKeys
from queueworks.protocol.models import JobState, Role
from queueworks.scripts.bound import JobBatch, Scripts
from queueworks.workers.progress import ProgressWriter
from tests.conftest import wait_for

NOOP = "tests.handlers:double"
TTL = 600


class _Log:
    def warning(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"progress not written: {args} {kwargs}")


@dataclass
class _Settled:  # what the worker's RunningJob gives the settle
    entry: JobEntry
    started_at: float
    attempt: int = 1
    outcome: str = "2"
    reason: str = ""


def _ctx(writer: ProgressWriter | None, job_id: str, named: bool = False) -> JobContext:
    return JobContext("q", job_id, 1, Role(0, 1, 1), "member-m", None, _sink=writer, _named=named)


def _held(r: redis.Redis, tk: TaskKeys) -> JobEntry:
    """A member takes the next entry (the job runs)."""
    reply: Any = r.xreadgroup(tk.group, "member-m", {tk.stream: ">"}, count=1)
    entry_id, fields = reply[0][1][0]
    return decode_entry(entry_id.decode(), fields)


def _settle(r: redis.Redis, tk: TaskKeys, entry: JobEntry) -> None:
    batch = JobBatch(ok=[_Settled(entry, time.time())])
    Scripts(r).settle_jobs(tk, batch, "member-m", time.time(), TTL, client=None)


def _evalshas(r: redis.Redis) -> int:
    stats: Any = r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fraction", "message", "names"),
    [
        (1.5, None, "progress fraction"),
        (-0.1, None, "progress fraction"),
        (math.nan, None, "progress fraction"),
        (math.inf, None, "progress fraction"),
        (True, None, "progress fraction"),
        ("0.5", None, "progress fraction"),
        (None, None, "progress fraction"),
        (0.5, 42, "progress message must be a str"),
        (0.5, "x" * 1001, "progress message has 1001 characters; at most 1000"),
    ],
)
def test_a_report_out_of_range_is_a_value_error_naming_it(
    fraction: Any, message: Any, names: str
) -> None:
    with pytest.raises(ValueError, match=names):
        checked_progress(fraction, message)
    with pytest.raises(ValueError, match=names):  # raised in the handler, sink or none
        _ctx(None, "1-0").progress(fraction, message)


@pytest.mark.unit
def test_reports_in_range_are_kept_as_given() -> None:
    assert checked_progress(0, None) == (0.0, None)
    assert checked_progress(1, "") == (1.0, "")
    assert checked_progress(0.5, "x" * 1000) == (0.5, "x" * 1000)
    _ctx(None, "1-0").progress(0.5, "no worker: nothing written")


@pytest.mark.integration
def test_a_running_jobs_partial_record_reads_right_and_the_settle_keeps_its_progress(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("partial", result_ttl=TTL)
    tk = keys.task("partial")
    job = q.enqueue(NOOP, {"x": 1})
    entry = _held(r, tk)
    writer = ProgressWriter(Scripts(r), tk, TTL, _Log())
    ctx = _ctx(writer, job.id)
    ctx.progress(0.25, "a quarter")

    assert r.hgetall(tk.job(job.id)) == {b"pg": b"0.25", b"pm": b"a quarter"}  # partial
    assert 0 < r.ttl(tk.job(job.id)) <= TTL  # a lost job's partial record goes
    running = job.status()
    assert (running.state, running.worker, running.handler) == (JobState.RUNNING, "member-m", NOOP)
    assert (running.progress, running.progress_message, running.attempts) == (0.25, "a quarter", 1)
    assert running.enqueued_at > 0
    with pytest.raises(TimeoutError):
        job.result(timeout=0.05)

    ctx.progress(0.5)  # within 0.1 s: waits, written when the call ends at the latest
    call_ended(ctx)
    assert r.hgetall(tk.job(job.id)) == {b"pg": b"0.5"}  # a report without message: none
    ctx.progress(0.75, "after the end")  # an abandoned call's: goes nowhere
    _settle(r, tk, entry)
    done = job.status()
    assert (done.state, done.handler, done.progress, done.progress_message) == (
        JobState.DONE,
        NOOP,
        0.5,
        None,
    )
    assert done.enqueued_at == running.enqueued_at and job.result(timeout=1) == 2
    assert Scripts(r).job_progress(tk, job.id, False, (0.9, None), TTL) is False  # settled
    assert job.status().progress == 0.5


@pytest.mark.integration
def test_a_partial_record_whose_entry_is_gone_is_no_job(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("gone", result_ttl=TTL)
    tk = keys.task("gone")
    job = q.enqueue(NOOP, {"x": 1})
    _held(r, tk)
    Scripts(r).job_progress(tk, job.id, False, (0.5, None), TTL)
    r.xdel(tk.stream, job.id)  # deleted by hand: no entry, no settle
    with pytest.raises(LookupError, match="has no job"):
        job.status()


@pytest.mark.integration
def test_a_named_jobs_record_keeps_its_expiry_and_a_stray_gets_none(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("named", result_ttl=TTL)
    tk = keys.task("named")
    later = q.enqueue(NOOP, {"x": 1}, delay=0.01)  # a record from the start, no expiry
    scripts = Scripts(r)
    assert scripts.job_progress(tk, later.id, True, (0.5, "half"), TTL) is True
    assert r.ttl(tk.job(later.id)) == -1
    assert later.status().progress == 0.5

    # an entry naming a job the queue has no record of: no record is made for it...
    r.xadd(tk.stream, {"j": "feedface", "h": NOOP, "p": "{}", "t": repr(time.time())})
    stray = _held(r, tk)
    assert scripts.job_progress(tk, "feedface", True, (0.5, None), TTL) is False
    assert not r.exists(tk.job("feedface"))
    # ... and one made by hand (progress alone) does not make it a job: rejected, dropped
    r.hset(tk.job("feedface"), "pg", "0.5")
    _settle(r, tk, stray)
    assert not r.exists(tk.job("feedface"))
    assert q.status().done == 0 and q.status().rejected == 1


@pytest.mark.integration
def test_reports_in_a_tight_loop_are_coalesced_and_the_last_is_written(
    client: Client, r: redis.Redis, keys: Keys
) -> None:
    q = client.queue("tight", result_ttl=TTL)
    tk = keys.task("tight")
    job = q.enqueue(NOOP, {"x": 1})
    _held(r, tk)
    scripts = Scripts(r)
    scripts.job_progress(tk, "0-1", False, (0.0, None), TTL)  # the script loaded: one call each
    ctx = _ctx(ProgressWriter(scripts, tk, TTL, _Log()), job.id)
    before, started = _evalshas(r), time.monotonic()
    for i in range(20_000):
        ctx.progress(i / 20_000, f"item {i}")
    spent = time.monotonic() - started
    writes = _evalshas(r) - before
    assert 1 <= writes <= 2 + spent / 0.1 * 1.5, (writes, spent)  # one per 0.1 s, about
    # the last report is written within 0.1 s or so without another (the flusher)...
    wait_for(lambda: job.status().progress == 19_999 / 20_000, 5, "the last report")
    assert job.status().progress_message == "item 19999"
    # ... and a burst's last report when the call ends, at the latest
    ctx.progress(0.1, "one")
    ctx.progress(0.2, "two")
    call_ended(ctx)
    assert (job.status().progress, job.status().progress_message) == (0.2, "two")
