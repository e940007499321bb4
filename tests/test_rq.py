"""Issue 8: whole target tasks as RQ jobs, run by real ``rq worker`` processes (the forking
``rq.Worker`` and ``rq.SimpleWorker``) while real queueworks processes do the subtasks.

One controller and one queueworks worker serve the whole module (the progress test brings
two fresh workers of its own, to show the fan-out); every test has its own RQ queue.
Budget: ~40 s on the shared 2-core machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Callback, Queue, Retry
from rq.command import send_stop_job_command
from rq.job import Job, JobStatus

import queueworks.rq as qwrq
from queueworks import Client, SubmitError, TaskSpec, TaskState
from tests.conftest import ROOT, Cluster, wait_for

WORKER_CLASSES = ["rq.Worker", "rq.SimpleWorker"]


def make_subtasks(n: int) -> list[dict[str, int]]:
    """A subtasks factory the RQ worker imports (``tests.test_rq:make_subtasks``)."""
    return [{"x": 100 + i} for i in range(n)]


def user_stopped(job: Job, connection: redis.Redis) -> None:
    """A user's own stopped callback, kept alongside queueworks' one: leaves a mark."""
    connection.rpush(f"qwrq:stopped:{job.id}", "1")


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qw(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A controller and one queueworks worker for the whole module's tasks (one after the
    other: one worker is enough; the progress test brings two of its own for the fan-out)."""
    cluster = Cluster(redis_url, f"rq{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("qw"))
    cluster.controller()
    cluster.worker()
    conn = redis.Redis.from_url(redis_url)
    cluster.wait_workers(conn, 1)
    conn.close()
    yield cluster
    cluster.close()


@pytest.fixture
def qclient(qw: Cluster, request: pytest.FixtureRequest) -> Iterator[Client]:
    c = Client.from_url(qw.redis_url, prefix=qw.prefix)
    yield c
    c.close()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(qw.logs())


@pytest.fixture
def queue(r: redis.Redis) -> Queue:
    return Queue(f"qwrq-{uuid.uuid4().hex[:8]}", connection=r)


class RqWorkers:
    """``rq worker`` subprocesses of one test; each is stopped at the end, by its pid."""

    def __init__(self, redis_url: str, tmp: Path) -> None:
        self.redis_url, self.tmp = redis_url, tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def start(self, queue: Queue, worker_class: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"rq-{len(self.procs)}.log"
        name = f"rqw-{uuid.uuid4().hex[:8]}"
        args = ["worker", "--burst", "--url", self.redis_url, "--worker-class", worker_class]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rq.cli", *args, "--name", name, queue.name],
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        self.logs.append(log)
        return proc

    def burst(self, queue: Queue, worker_class: str, timeout: float = 60.0) -> str:
        """Run one burst worker until the queue is empty; its log."""
        proc = self.start(queue, worker_class)
        assert proc.wait(timeout) == 0, self.logs[-1].read_text()
        return self.logs[-1].read_text()

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.send_signal(signal.SIGTERM)  # the second one is RQ's cold shutdown
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


@pytest.fixture
def rq_workers(
    redis_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[RqWorkers]:
    workers = RqWorkers(redis_url, tmp_path)
    yield workers
    workers.close()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for log in workers.logs:
            print(f"--- {log.name} ---\n{log.read_text()[-4000:]}")


def spec(handler: str, n: int, **options: Any) -> TaskSpec:
    extra = options.pop("payload", {})
    payloads = [{"x": i, **extra} for i in range(n)]
    return TaskSpec(name=handler.split(":")[1], handler=handler, subtasks=payloads, **options)


def long_spec() -> TaskSpec:
    """~40 s of work on one node: long enough to be cancelled while it runs."""
    return spec("tests.handlers:double_slow", 200, payload={"seconds": 0.2})


def wait_running(job: Job, timeout: float = 20.0) -> str:
    wait_for(lambda: job.get_meta().get("state") == "running", timeout, "task running")
    return str(job.get_meta()["task_id"])


def tasks_of(client: Client, job: Job) -> list[str]:
    return [t.id for t in client.tasks() if qwrq.job_id_of(client, t.id) == job.id]


# -- tests -------------------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_target_task_ends_finished_with_its_summary(
    worker_class: str, qw: Cluster, qclient: Client, queue: Queue, rq_workers: RqWorkers
) -> None:
    job = qwrq.enqueue(queue, spec("tests.handlers:double", 20), prefix=qw.prefix)
    made = qwrq.enqueue(
        queue,
        TaskSpec(name="made", handler="tests.handlers:double"),
        subtasks_factory="tests.test_rq:make_subtasks",
        factory_kwargs={"n": 5},
        prefix=qw.prefix,
    )
    assert job.get_status() == JobStatus.QUEUED
    rq_workers.burst(queue, worker_class)

    assert job.get_status() == JobStatus.FINISHED
    summary = job.return_value()
    assert summary is not None
    task_id = summary["task_id"]
    assert summary == {
        "task_id": task_id,
        "name": "double",
        "state": "completed",
        "total": 20,
        "done": 20,
        "dead": 0,
        "seconds": summary["seconds"],
        "dead_letters": [],
    }
    assert 0 <= summary["seconds"] < 60
    assert dict(qclient.task(task_id).results()) == {i: 2 * i for i in range(20)}
    meta = job.get_meta()
    assert meta == {
        "task_id": task_id,
        "state": "completed",
        "total": 20,
        "done": 20,
        "dead": 0,
        "progress": 1.0,
    }
    # the link both ways: task record -> RQ job id, job -> task id
    assert qwrq.job_id_of(qclient, task_id) == job.id
    assert qwrq.task_id_of(job) == task_id
    assert (
        job.description == "queueworks target task 'double': 20 subtasks of tests.handlers:double"
    )

    assert made.get_status() == JobStatus.FINISHED
    made_id = made.return_value()["task_id"]  # type: ignore[index]
    assert dict(qclient.task(made_id).results()) == {i: 2 * (100 + i) for i in range(5)}


@pytest.mark.system
def test_a_rerun_follows_the_task_its_last_run_left_running(
    qw: Cluster, qclient: Client, queue: Queue, rq_workers: RqWorkers
) -> None:
    # as after a lost work horse: the job's meta names a task that still runs (until the
    # gate opens, once the job follows it)
    gate = f"{qw.prefix}:gate:{uuid.uuid4().hex[:6]}"
    gated = spec("tests.handlers:double_at_gate", 8, payload={"gate": gate})
    running = qclient.submit(gated)
    job = qwrq.enqueue(
        queue, spec("tests.handlers:double", 1), prefix=qw.prefix, meta={"task_id": running.id}
    )
    proc = rq_workers.start(queue, "rq.SimpleWorker")
    wait_for(lambda: qwrq.job_id_of(qclient, running.id) == job.id, 60, "the job following")
    qclient.redis.set(gate, 1)
    assert proc.wait(60) == 0
    assert job.get_status() == JobStatus.FINISHED
    summary = job.return_value()
    assert summary is not None
    assert (summary["task_id"], summary["total"], summary["done"]) == (running.id, 8, 8)
    assert tasks_of(qclient, job) == [running.id]


@pytest.mark.system
@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_failing_target_task_lands_in_failed_registry(
    worker_class: str, qw: Cluster, qclient: Client, queue: Queue, rq_workers: RqWorkers
) -> None:
    failing = spec("tests.handlers:always_fails", 3, max_attempts=1, max_dead=0)
    bad = qwrq.enqueue(queue, failing, prefix=qw.prefix)
    retried = qwrq.enqueue(queue, failing, prefix=qw.prefix, retry=Retry(max=1))
    # dead letters without max_dead: queueworks completes the task, so RQ finishes the job
    lenient = qwrq.enqueue(
        queue, spec("tests.handlers:fail_odd", 4, max_attempts=1), prefix=qw.prefix
    )
    rq_workers.burst(queue, worker_class)

    assert bad.get_status() == JobStatus.FAILED
    assert bad.id in queue.failed_job_registry.get_job_ids()
    result = bad.latest_result()
    assert result is not None and result.exc_string is not None
    assert "TargetTaskFailed" in result.exc_string
    assert "failed: more than 0 subtasks dead-lettered" in result.exc_string
    # the first dead letter failed it (max_dead=0): a finished task's counts never change
    assert "1 of 3 subtasks dead-lettered, 0 done" in result.exc_string
    assert "ValueError: cannot handle {'x': 0}" in result.exc_string
    assert bad.get_meta()["state"] == "failed"

    # RQ's Retry runs the job again: a fresh target task each run
    assert retried.get_status() == JobStatus.FAILED
    assert len(tasks_of(qclient, retried)) == 2

    assert lenient.get_status() == JobStatus.FINISHED
    summary = lenient.return_value()
    assert summary is not None
    assert (summary["state"], summary["done"], summary["dead"]) == ("completed", 2, 2)
    assert sorted(d["index"] for d in summary["dead_letters"]) == [1, 3]
    assert all(d["error"] == "ValueError: odd" for d in summary["dead_letters"])


@pytest.mark.system
def test_depends_on_orders_two_target_tasks(
    qw: Cluster, qclient: Client, queue: Queue, rq_workers: RqWorkers
) -> None:
    slow = spec("tests.handlers:double_slow", 10, payload={"seconds": 0.05})
    first = qwrq.enqueue(queue, slow, prefix=qw.prefix)
    second = qwrq.enqueue(
        queue, spec("tests.handlers:double", 5), prefix=qw.prefix, depends_on=first
    )
    assert second.get_status() == JobStatus.DEFERRED
    rq_workers.burst(queue, "rq.Worker")

    assert first.get_status() == second.get_status() == JobStatus.FINISHED
    a = qclient.task(first.return_value()["task_id"]).status()  # type: ignore[index]
    b = qclient.task(second.return_value()["task_id"]).status()  # type: ignore[index]
    assert a.finished_at is not None and b.started_at is not None
    assert a.finished_at <= b.created_at  # the second task is submitted after the first ended


@pytest.mark.system
def test_progress_shows_in_job_meta_while_running(
    cluster: Cluster, r: redis.Redis, queue: Queue, rq_workers: RqWorkers, redis_url: str
) -> None:
    cluster.controller()
    for _ in range(2):  # small reads: the first read takes a whole batch, before any timing
        cluster.worker(extra=["--batch-size", "2"])
    cluster.wait_workers(r, 2)
    # three gates, opened in turn: subtasks 0-9 run at the first, 10-19 at the second, the
    # rest at the third, so the job is seen running with some done, then with more (a
    # member settles what it ran a batch at a time: the counts held are near 10 and 20)
    gates = [f"{cluster.prefix}:gate:{g}" for g in "abc"]
    payloads = [{"x": i, "gate": gates[min(i // 10, 2)]} for i in range(40)]
    job = qwrq.enqueue(
        queue,
        TaskSpec(name="gated", handler="tests.handlers:double_at_gate", subtasks=payloads),
        prefix=cluster.prefix,
    )
    proc = rq_workers.start(queue, "rq.Worker")
    wait_running(job, timeout=60)
    info = subprocess.run(
        [sys.executable, "-m", "rq.cli", "info", "--url", redis_url, queue.name],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "1 executing" in info.stdout  # ``rq info`` shows the target task as a running job
    seen: list[dict[str, Any]] = []

    def done_past(low: int) -> int | None:
        """The meta's count of done subtasks, if the job runs and it is past ``low``."""
        meta = job.get_meta()
        if job.get_status() != JobStatus.STARTED or meta.get("state") != "running":
            return None
        seen.append(meta)
        return int(meta["done"]) if meta["done"] > low else None

    held = 0
    for gate in gates[:2]:
        r.set(gate, 1)  # the next gate holds the rest: the meta must show the count between
        held = wait_for(lambda low=held: done_past(low), 60, f"the job's meta past {held} done")
        assert held < 40
    r.set(gates[2], 1)
    assert proc.wait(60) == 0
    middle = [m for m in seen if 0 < m["done"] < 40]
    assert all(m["total"] == 40 and m["progress"] == round(m["done"] / 40, 4) for m in middle)
    assert len({m["done"] for m in middle}) >= 2  # updated while it runs, not only once
    assert job.get_status() == JobStatus.FINISHED
    assert job.get_meta()["progress"] == 1.0
    # one RQ job, fanned out over both queueworks workers
    with Client.from_url(redis_url, prefix=cluster.prefix) as client:
        results = dict(client.task(qwrq.task_id_of(job) or "").results())
    assert len({v["worker"] for v in results.values()}) == 2


@pytest.mark.system
@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_stopping_the_rq_job_cancels_the_task(
    worker_class: str, qw: Cluster, qclient: Client, queue: Queue, rq_workers: RqWorkers
) -> None:
    job = qwrq.enqueue(queue, long_spec(), prefix=qw.prefix, on_stopped=Callback(user_stopped))
    proc = rq_workers.start(queue, worker_class)
    task = qclient.task(wait_running(job))
    send_stop_job_command(queue.connection, job.id)
    wait_for(lambda: task.status().state == TaskState.CANCELLED, 10, "task cancelled")
    assert proc.wait(30) == 0
    assert job.get_status() == JobStatus.STOPPED
    assert job.id in queue.failed_job_registry.get_job_ids()
    assert task.status().done < 200
    if worker_class == "rq.Worker":  # RQ 3 runs on_stopped only where it kills a work horse
        assert queue.connection.lrange(f"qwrq:stopped:{job.id}", 0, -1) == [b"1"]
        queue.connection.delete(f"qwrq:stopped:{job.id}")


@pytest.mark.system
@pytest.mark.parametrize("worker_class", WORKER_CLASSES)
def test_canceling_the_rq_job_cancels_the_task(
    worker_class: str, qw: Cluster, qclient: Client, queue: Queue, rq_workers: RqWorkers
) -> None:
    job = qwrq.enqueue(queue, long_spec(), prefix=qw.prefix, retry=Retry(max=2))
    proc = rq_workers.start(queue, worker_class)
    task = qclient.task(wait_running(job))
    job.cancel()
    wait_for(lambda: task.status().state == TaskState.CANCELLED, 10, "task cancelled")
    assert proc.wait(30) == 0
    # RQ 3 leaves a canceled job running; queueworks stops it, so it is not retried
    assert job.get_status() == JobStatus.STOPPED
    assert tasks_of(qclient, job) == [task.id]
    assert job.get_meta()["state"] == "cancelled"


@pytest.mark.system
def test_cancelling_the_task_in_queueworks_stops_the_rq_job(
    qw: Cluster, qclient: Client, queue: Queue, rq_workers: RqWorkers
) -> None:
    job = qwrq.enqueue(queue, long_spec(), prefix=qw.prefix, retry=Retry(max=2))
    proc = rq_workers.start(queue, "rq.SimpleWorker")
    task = qclient.task(wait_running(job))
    assert task.cancel()
    assert proc.wait(30) == 0
    assert job.get_status() == JobStatus.STOPPED  # stopped, so RQ does not retry it
    assert tasks_of(qclient, job) == [task.id]
    result = job.latest_result()
    assert result is not None and "task cancelled in queueworks" in (result.exc_string or "")


@pytest.mark.system
def test_job_timeout_cancels_the_task(
    qw: Cluster, qclient: Client, queue: Queue, rq_workers: RqWorkers
) -> None:
    # 10 s: the work horse forks, imports and submits well within it on a loaded machine
    # (at 2 s it could time out before the task existed); the task needs ~40 s
    job = qwrq.enqueue(queue, long_spec(), prefix=qw.prefix, job_timeout=10)
    rq_workers.burst(queue, "rq.Worker")
    assert job.get_status() == JobStatus.FAILED
    result = job.latest_result()
    assert result is not None and "JobTimeoutException" in (result.exc_string or "")
    task = qclient.task(str(job.get_meta()["task_id"]))
    assert task.status().state == TaskState.CANCELLED
    assert job.get_meta()["state"] == "cancelled"


@pytest.mark.integration
def test_enqueue_stores_json_only_and_refuses_bad_input(r: redis.Redis, queue: Queue) -> None:
    job = qwrq.enqueue(
        queue,
        spec("tests.handlers:double", 3),
        redis_url="redis://:secret@localhost:1/0",
        on_stopped=Callback(user_stopped, timeout=7),
    )
    target = job.kwargs["target"]
    assert json.loads(json.dumps(target)) == target  # nothing but JSON in the job
    assert json.loads(target["subtasks_json"]) == [{"x": 0}, {"x": 1}, {"x": 2}]
    assert target["on_stopped"] == "tests.test_rq.user_stopped"
    assert job.stopped_callback_timeout == 7
    assert job.description is not None and "secret" not in job.description
    assert "{'x'" not in job.description

    with pytest.raises(SubmitError, match=r"subtasks\[1\] is not JSON-serializable"):
        qwrq.enqueue(queue, TaskSpec(name="n", handler="m:f", subtasks=[{"x": 1}, {"x": {1, 2}}]))
    with pytest.raises(SubmitError, match="either"):
        qwrq.enqueue(queue, spec("m:f", 2), subtasks_factory="tests.test_rq:make_subtasks")
    with pytest.raises(ValueError, match="must look like"):
        qwrq.enqueue(queue, TaskSpec(name="n", handler="m:f"), subtasks_factory="nope")
    assert queue.count == 1  # nothing was enqueued by the refused calls

    later = qwrq.enqueue_in(queue, timedelta(hours=1), spec("tests.handlers:double", 1))
    assert later.get_status() == JobStatus.SCHEDULED
    assert later.id in queue.scheduled_job_registry.get_job_ids()
