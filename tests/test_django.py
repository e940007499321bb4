"""Django's Tasks framework on queueworks (``queueworks.contrib.django``), against real
Django (``django.tasks`` on Django 6, the ``django-tasks`` backport on Django 5.2: this
file runs on either; ``.ci/run`` runs it on both), a real project (``tests/djangoproject``)
and real worker processes started with ``--django``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import ROOT, Cluster, missing, need_module, wait_for

django = need_module("django", "pip install 'queueworks[django]'")
if django.VERSION < (6, 0):
    need_module("django_tasks", "pip install 'queueworks[django]' (Django 5.2: django-tasks)")

SETTINGS = "tests.djangoproject.settings"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
django.setup()

from django.test.utils import override_settings  # noqa: E402

from queueworks.contrib.django import QueueworksBackend, TaskFailed, job_priority  # noqa: E402
from queueworks.contrib.django.backend import ENQUEUE_TAKES_PRIORITY  # noqa: E402
from queueworks.contrib.django.compat import TASKS  # noqa: E402
from queueworks.contrib.django.results import HANDLER, task_error  # noqa: E402
from tests.djangoproject import tasks  # noqa: E402

if os.environ.get("DJANGO_SETTINGS_MODULE") != SETTINGS:
    missing(
        "tests/djangoproject's settings", f"unset DJANGO_SETTINGS_MODULE (it is not {SETTINGS})"
    )

Status = TASKS.TaskResultStatus
DJANGO_ALLOW = ("tests.djangoproject",)


@pytest.fixture
def backend(redis_url: str, prefix: str) -> Iterator[Any]:
    """The project's TASKS, on this test's Redis and key prefix."""
    options = {"redis_url": redis_url, "prefix": prefix, "allow": ["tests.djangoproject"]}
    options["queue_settings"] = {"max_attempts": 1}
    given = {
        "default": {
            "BACKEND": "queueworks.contrib.django.QueueworksBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": options,
        }
    }
    with override_settings(TASKS=given):
        found = TASKS.task_backends["default"]
        assert isinstance(found, QueueworksBackend)
        yield found


def django_worker(cluster: Cluster, *, allow: tuple[str, ...] = DJANGO_ALLOW, **kw: Any) -> Any:
    return cluster.worker(allow=allow, extra=["--django", SETTINGS], **kw)


def finished(backend: Any, result_id: str, timeout: float = 60) -> Any:
    def look() -> Any:
        found = backend.get_result(result_id)
        return found if found.is_finished else None

    return wait_for(look, timeout, f"task {result_id} to finish", interval=0.05)


@pytest.mark.system
def test_tasks_run_on_a_django_worker_and_any_process_reads_their_results(
    cluster: Cluster, backend: Any, r: redis.Redis, tmp_path: Path
) -> None:
    signals = tmp_path / "signals.jsonl"
    cluster.controller()
    django_worker(cluster, name="dj-1", env={"DJANGO_SIGNALS": str(signals)})
    cluster.wait_workers(r, 1)

    added = tasks.add.enqueue(2, 3)
    assert added.status == Status.READY and added.backend == "default"
    assert added.id.startswith("default/") and added.args == [2, 3]
    sent = tasks.send.enqueue("ada@example.com")  # queue_name="emails"
    assert sent.id.startswith("emails/")
    context = tasks.with_context.enqueue(x=7)
    coroutine = tasks.async_add.enqueue(20, 22)

    done = finished(backend, added.id)
    assert done.status == Status.SUCCESSFUL and done.return_value == 5
    assert done.worker_ids == ["dj-1"] and done.attempts == 1 and done.errors == []
    assert done.enqueued_at <= done.started_at <= done.finished_at
    assert done.started_at.tzinfo is not None  # USE_TZ: aware times
    assert done.task.func is tasks.add.func and done.args == [2, 3]
    added.refresh()  # the framework's own refresh reads the backend
    assert added.status == Status.SUCCESSFUL and added.return_value == 5
    assert tasks.add.get_result(added.id).return_value == 5

    assert finished(backend, sent.id).return_value == "sent to ada@example.com"
    assert sent.id.split("/", 1)[0] == "emails"
    got = finished(backend, context.id).return_value
    assert got == {"attempt": 1, "id": context.id, "x": 7, "workers": ["dj-1"]}
    assert finished(backend, coroutine.id).return_value == 42

    # the async API: aenqueue, aget_result
    async def both() -> Any:
        queued = await tasks.add.aenqueue(40, 2)
        return await backend.aget_result(queued.id), queued.id

    fresh, async_id = asyncio.run(both())
    assert fresh.status in (Status.READY, Status.RUNNING, Status.SUCCESSFUL)
    assert finished(backend, async_id).return_value == 42

    # another process (a fresh interpreter with the project's settings) reads a result
    code = (
        "import django, json, sys; django.setup();"
        f"from {TASKS.task_backends.__module__} import task_backends;"
        "res = task_backends['default'].get_result(sys.argv[1]);"
        "print(json.dumps([str(res.status), res.return_value, res.worker_ids]))"
    )
    env = {**cluster.env, "DJANGO_SETTINGS_MODULE": SETTINGS}
    out = subprocess.run(
        [sys.executable, "-c", code, added.id],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ["SUCCESSFUL", 5, ["dj-1"]]

    # the worker sent the framework's signals, for each task
    lines = [json.loads(x) for x in signals.read_text().splitlines()]
    for result in (added, sent, context, coroutine):
        mine = [(x["signal"], x["status"]) for x in lines if x["id"] == result.id]
        assert mine == [("started", "RUNNING"), ("finished", "SUCCESSFUL")], lines


@pytest.mark.system
def test_failed_running_and_deferred_tasks(cluster: Cluster, backend: Any, r: redis.Redis) -> None:
    cluster.controller()
    django_worker(cluster, name="dj-2")
    cluster.wait_workers(r, 1)

    failed = finished(backend, tasks.boom.enqueue("no luck").id)
    assert failed.status == Status.FAILED and failed.worker_ids == ["dj-2"]
    (error,) = failed.errors
    assert error.exception_class_path == "tests.djangoproject.tasks.Boom"
    assert error.exception_class is tasks.Boom
    assert error.traceback.rstrip().endswith("tests.djangoproject.tasks.Boom: no luck")
    assert "TaskFailed" not in error.traceback and "def boom" not in error.traceback
    assert "in boom" in error.traceback  # the task's own frame
    with pytest.raises(ValueError, match="failed"):
        failed.return_value  # noqa: B018

    slow = tasks.slow.enqueue(2.0)
    wait_for(lambda: backend.get_result(slow.id).status == Status.RUNNING, 30, "the task running")
    with pytest.raises(ValueError, match="not finished"):
        backend.get_result(slow.id).return_value  # noqa: B018
    assert finished(backend, slow.id).return_value == "slept"

    run_after = datetime.now(UTC) + timedelta(seconds=2)
    later = tasks.when_ran.using(run_after=run_after).enqueue()
    time.sleep(0.5)
    assert backend.get_result(later.id).status == Status.READY
    ran = finished(backend, later.id)
    assert ran.return_value >= run_after.timestamp()

    with pytest.raises(TASKS.TaskResultDoesNotExist):
        backend.get_result("default/0123456789abcdef0123")
    with pytest.raises(TASKS.TaskResultDoesNotExist):
        backend.get_result("no-slash")


@pytest.mark.system
def test_a_worker_runs_only_tasks_its_allow_covers_and_closes_connections(
    cluster: Cluster, backend: Any, r: redis.Redis
) -> None:
    """A worker whose --allow does not cover the task's module does not import it (the
    attempt fails, naming the prefixes); one that does closes the task's database
    connection after each job (``CONN_MAX_AGE`` 0), as Django's request cycle does."""
    cluster.controller()
    narrow = django_worker(cluster, name="dj-3", allow=("tests.handlers",))
    cluster.wait_workers(r, 1)
    refused = finished(backend, tasks.add.enqueue(1, 1).id)
    assert refused.status == Status.FAILED
    (error,) = refused.errors
    assert error.exception_class_path == "builtins.PermissionError"
    assert "outside this worker's allowed module prefixes" in error.traceback

    assert narrow.terminate() == 0
    django_worker(cluster, name="dj-4")
    wait_for(lambda: r.zscore(f"{cluster.prefix}:workers", "dj-4"), 60, "dj-4 registered")
    first = tasks.connection_was_open.using(queue_name="emails").enqueue()
    assert finished(backend, first.id).return_value is False
    second = tasks.connection_was_open.using(queue_name="emails").enqueue()
    assert finished(backend, second.id).return_value is False


def outside(x: int) -> int:  # a module-level function outside the backend's "allow"
    return x


@pytest.mark.integration
def test_enqueue_sends_task_enqueued_and_makes_a_ready_job(backend: Any) -> None:
    seen: list[Any] = []

    def receiver(sender: type, task_result: Any, **kw: Any) -> None:
        seen.append((sender, task_result))

    TASKS.task_enqueued.connect(receiver)
    try:
        result = tasks.add.enqueue(1, 2)
    finally:
        TASKS.task_enqueued.disconnect(receiver)
    assert seen == [(QueueworksBackend, result)]
    queue, job_id = result.id.split("/")
    status = backend.client.job_status(queue, job_id)
    assert status.state == "queued" and status.handler == "queueworks.contrib.django:run_task"
    read = backend.get_result(result.id)
    assert read.status == Status.READY and read.args == [1, 2] and read.worker_ids == []
    assert job_priority(-100) < job_priority(0) < job_priority(100)


@pytest.mark.system
def test_a_worker_with_settings_it_cannot_load_says_so(cluster: Cluster) -> None:
    worker = cluster.worker(allow=DJANGO_ALLOW, extra=["--django", "tests.nosuchproject"])
    assert worker.p.wait(60) == 2
    assert "--django tests.nosuchproject: ModuleNotFoundError" in worker.log()


@pytest.mark.system
def test_priorities_run_in_order_or_are_refused(
    cluster: Cluster, backend: Any, r: redis.Redis
) -> None:
    """Where jobs have priorities, Django's run in their order; where they do not, the
    backend says so and a task with a priority is refused (never dropped silently)."""
    assert QueueworksBackend.supports_priority is ENQUEUE_TAKES_PRIORITY
    if not ENQUEUE_TAKES_PRIORITY:
        with pytest.raises(TASKS.InvalidTask, match="priority"):
            tasks.when_ran.using(priority=50).enqueue()
        return
    low = [tasks.when_ran.using(priority=-50).enqueue() for _ in range(3)]
    high = [tasks.when_ran.using(priority=50).enqueue() for _ in range(3)]
    cluster.controller()
    django_worker(cluster, name="dj-5")
    ran = {x.id: finished(backend, x.id).return_value for x in low + high}
    assert max(ran[x.id] for x in high) < min(ran[x.id] for x in low)


@pytest.mark.integration
def test_validate_task_refuses_what_cannot_work(backend: Any) -> None:
    with pytest.raises(TASKS.InvalidTask, match="outside the allowed module prefixes"):
        TASKS.Task(func=outside)
    with pytest.raises(TASKS.InvalidTask, match="Queue 'nope' is not valid"):
        tasks.add.using(queue_name="nope")
    with pytest.raises(TypeError, match=r"args\[1\] is no JSON value \(object\)"):
        tasks.add.enqueue(1, object())
    with pytest.raises(ValueError, match=r"kwargs\['b'\] is no JSON value"):
        tasks.add.enqueue(1, b={1, 2})
    with pytest.raises(ValueError, match="unknown \\['redis'\\]"):
        QueueworksBackend("x", {"OPTIONS": {"redis": "redis://"}})


@pytest.mark.unit
def test_task_error_names_the_task_exception() -> None:
    try:
        try:
            raise tasks.Boom("line one\nline two")
        except tasks.Boom as exc:
            raise TaskFailed("tests.djangoproject.tasks.Boom: line one") from exc
    except TaskFailed as exc:
        import traceback

        text = "".join(traceback.format_exception(exc))
    error = task_error(text)
    assert error.exception_class_path == "tests.djangoproject.tasks.Boom"
    assert "TaskFailed" not in error.traceback and "line two" in error.traceback
    plain = task_error('Traceback (most recent call last):\n  File "x"\nTimeoutError: slow\n')
    assert plain.exception_class_path == "builtins.TimeoutError"


@pytest.mark.integration
def test_reading_a_result_imports_no_module_outside_the_allowed_prefixes(backend: Any) -> None:
    """A result's task is named by its job's payload, which anyone who can write to Redis
    writes: reading it imports only under the backend's ``allow`` prefixes."""
    q = backend.client.queue("default")
    job = q.enqueue(HANDLER, {"task": "qw_never_imported.tasks.t", "args": [], "kwargs": {}})
    with pytest.raises(TASKS.TaskResultDoesNotExist):
        backend.get_result(f"default/{job.id}")
    assert "qw_never_imported" not in sys.modules


@pytest.mark.unit
def test_django_priorities_map_onto_job_priorities_in_order() -> None:
    from queueworks.contrib.django import job_priority

    mapped = [job_priority(p) for p in range(-100, 101)]
    assert mapped == sorted(mapped)  # never inverted
    assert (job_priority(-100), job_priority(0), job_priority(100)) == (-5, 0, 5)
    assert (job_priority(9), job_priority(10), job_priority(-10), job_priority(50)) == (0, 1, -1, 3)
