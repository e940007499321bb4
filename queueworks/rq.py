"""Target tasks as RQ jobs: ``queueworks.rq.enqueue(queue, spec)``.

A whole target task becomes one RQ job. The job function (``run_target_task``) runs in an
ordinary ``rq worker`` (forking ``Worker`` or ``SimpleWorker``): it submits the task to
queueworks, follows it every ``poll`` seconds and mirrors its progress into ``job.meta``.
The RQ job then follows the task:

==========================  =================================================================
queueworks task             RQ job
==========================  =================================================================
running                     ``started``; ``job.meta``: task_id, state, total, done, dead,
                            progress (updated while it runs)
completed (also with dead   ``finished``; the result is the summary dict (task_id, name,
letters, within max_dead)   state, total, done, dead, seconds, dead_letters)
failed (dead > max_dead)    ``failed`` (FailedJobRegistry; RQ's ``Retry`` applies) with
                            ``TargetTaskFailed``, whose message is the dead-letter summary
cancelled                   ``stopped`` (FailedJobRegistry, never retried)
==========================  =================================================================

And the other way round: ``send_stop_job_command`` / ``send_stop_execution_command``,
``job.cancel()`` and ``job.delete()`` of the running job cancel the task (the job ends
``stopped``); the job timeout and a ``SimpleWorker``'s cold shutdown cancel it too (the
job ends ``failed``, as RQ records those). A work horse killed outside a stop command
(SIGKILL, OOM) cannot: a re-run of the job (requeue, ``Retry``) follows the task it left.

The spec travels as JSON: ``spec.model_dump(mode="json")`` plus the subtasks as one JSON
text, or a ``subtasks_factory`` ("module:function") the RQ worker calls to make them.
No connection details are stored in the job unless ``redis_url`` is given: by default the
job uses the RQ worker's own connection (the Redis the queue lives on).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Sized
from datetime import datetime, timedelta
from importlib import import_module
from typing import Any, NoReturn

import redis
import structlog
from pydantic import BaseModel, ConfigDict, Field

try:
    import rq
except ImportError as exc:  # the `rq` extra is not installed
    raise ImportError("queueworks.rq needs RQ: pip install 'queueworks[rq]'") from exc
from rq.callbacks import Callback
from rq.command import PUBSUB_CHANNEL_TEMPLATE, send_command
from rq.exceptions import InvalidJobOperation
from rq.job import Job, JobStatus

from queueworks.client.sync import Client, Task, sync_subtasks
from queueworks.errors import (
    NotJSON,
    SubmitError,
    TargetTaskCancelled,
    TargetTaskFailed,
    TaskNotFound,
)
from queueworks.protocol.messages import to_json
from queueworks.protocol.models import TaskSpec, TaskState, TaskStatus, parse_handler_path

RQ_JOB_FIELD = "rq_job"  # field of the task record that names its RQ job
POLL = 0.2  # seconds between two looks at the task
STOP_GRACE = 0.5  # after a stop command: time for the RQ worker to mark the job stopped
STOP_COMMANDS = ("stop-job", "stop-execution")
FIRST_DEAD_LETTERS = 3  # dead letters quoted in a summary
JOB_STOPPED, JOB_CANCELED, JOB_DELETED = "RQ job stopped", "RQ job canceled", "RQ job deleted"
TASK_CANCELLED = "task cancelled in queueworks"


class Target(BaseModel):
    """The job function's one argument: everything the RQ worker needs, JSON only."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any]
    subtasks_json: str | None = None
    subtasks_factory: str | None = None
    factory_kwargs: dict[str, Any] = Field(default_factory=dict)
    redis_url: str | None = None
    prefix: str = Field(default="qw", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    poll: float = Field(default=POLL, gt=0, le=10)
    on_stopped: str | None = None  # the user's own stopped callback, run after ours

    def task_spec(self) -> TaskSpec:
        """The spec with its subtasks (parsed, or made by the factory in this process)."""
        subtasks: Any
        if self.subtasks_factory is not None:
            module, attr = parse_handler_path(self.subtasks_factory)
            subtasks = getattr(import_module(module), attr)(**self.factory_kwargs)
        else:
            subtasks = json.loads(self.subtasks_json or "[]")
        return TaskSpec.model_validate({**self.spec, "subtasks": subtasks})


# -- enqueueing (the caller's side) ------------------------------------------------------


def enqueue(queue: rq.Queue, spec: TaskSpec, **options: Any) -> Job:
    """Enqueue the whole target task ``spec`` as one RQ job and return the job.

    Options of queueworks: ``prefix`` (default ``"qw"``), ``redis_url`` (default: the RQ
    worker's own connection), ``poll`` (seconds, default 0.2), ``subtasks_factory``
    ("module:function" called in the RQ worker to make the subtasks) with
    ``factory_kwargs``. Every other option goes to ``Queue.enqueue`` as it is
    (``depends_on``, ``retry``, ``job_timeout``, ``result_ttl``, ``job_id``, ``meta``,
    ``on_success``, ``on_stopped``, ...).

    ``spec.subtasks`` is consumed here (a generator is read to the end) and stored in the
    job as one JSON text; for very many subtasks pass ``subtasks_factory`` instead.
    """
    kwargs, rq_options = _job_call(spec, options)
    return queue.enqueue(run_target_task, kwargs=kwargs, **rq_options)


def enqueue_at(queue: rq.Queue, when: datetime, spec: TaskSpec, **options: Any) -> Job:
    """As ``enqueue``, run at ``when`` (a worker started ``--with-scheduler`` moves it)."""
    kwargs, rq_options = _job_call(spec, options)
    job: Job = queue.enqueue_at(when, run_target_task, kwargs=kwargs, **rq_options)
    return job


def enqueue_in(queue: rq.Queue, delay: timedelta, spec: TaskSpec, **options: Any) -> Job:
    """As ``enqueue``, run ``delay`` from now (needs ``--with-scheduler``)."""
    kwargs, rq_options = _job_call(spec, options)
    return queue.enqueue_in(delay, run_target_task, kwargs=kwargs, **rq_options)


_OWN_OPTIONS = ("subtasks_factory", "factory_kwargs", "redis_url", "prefix", "poll")


def _job_call(spec: TaskSpec, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job function's kwargs and the options for RQ (ours as defaults under theirs)."""
    rq_options = dict(options)
    own = {k: rq_options.pop(k) for k in _OWN_OPTIONS if k in rq_options}
    target, count = _prepare(spec, **own)
    theirs = rq_options.pop("on_stopped", None)
    stopped = Callback(cancel_on_stop)
    if theirs is not None:  # keep the user's own: ours runs first, then theirs
        callback = theirs if isinstance(theirs, Callback) else Callback(theirs)
        target["on_stopped"] = callback.name
        stopped = Callback(cancel_on_stop, timeout=callback.timeout)
    made = "factory-made" if count is None else str(count)
    rq_options.setdefault(
        # RQ's default description is the call with its arguments: every subtask, a URL
        "description",
        f"queueworks target task {spec.name!r}: {made} subtasks of {spec.handler}",
    )
    return {"target": target}, {**rq_options, "on_stopped": stopped}


def _prepare(
    spec: TaskSpec,
    subtasks_factory: str | None = None,
    factory_kwargs: dict[str, Any] | None = None,
    redis_url: str | None = None,
    prefix: str = "qw",
    poll: float = POLL,
) -> tuple[dict[str, Any], int | None]:
    """The job's one JSON argument and the number of subtasks in it (None: a factory's).

    A bad subtask is a ``SubmitError`` naming it."""
    subtasks_json: str | None = None
    count: int | None = None
    if subtasks_factory is not None:
        parse_handler_path(subtasks_factory)
        if not isinstance(spec.subtasks, Sized) or len(spec.subtasks):
            raise SubmitError("give either spec.subtasks or subtasks_factory, not both")
    else:
        parts = []
        try:
            for index, payload in enumerate(sync_subtasks(spec)):
                parts.append(to_json(payload, f"subtasks[{index}]"))
        except NotJSON as exc:
            raise SubmitError(str(exc)) from None
        subtasks_json = "[" + ",".join(parts) + "]"
        count = len(parts)
    try:
        to_json(factory_kwargs or {}, "factory_kwargs")
    except NotJSON as exc:
        raise SubmitError(str(exc)) from None
    target = Target(
        spec=spec.model_dump(mode="json"),
        subtasks_json=subtasks_json,
        subtasks_factory=subtasks_factory,
        factory_kwargs=factory_kwargs or {},
        redis_url=redis_url,
        prefix=prefix,
        poll=poll,
    )
    return target.model_dump(mode="json"), count


# -- the job function (the RQ worker's side) ----------------------------------------------


def run_target_task(target: dict[str, Any]) -> dict[str, Any]:
    """The RQ job: submit the target task, follow it, return its summary or raise."""
    args = Target.model_validate(target)
    job = rq.get_current_job()
    if job is None:
        raise RuntimeError("run_target_task runs inside an RQ job (enqueue it with RQ)")
    client = _client(args, job.connection)
    try:
        return _Follower(job, client, args).run()
    finally:
        if args.redis_url is not None:
            client.close()


def cancel_on_stop(job: Job, connection: redis.Redis) -> None:
    """RQ's stopped callback: the forking worker runs it after it killed the work horse,
    which had no chance to cancel the task itself."""
    args = Target.model_validate(job.kwargs["target"])
    task_id = job.get_meta(refresh=True).get("task_id")
    if task_id:
        client = _client(args, connection)
        try:
            _cancel(client.task(str(task_id)), job.id, JOB_STOPPED)
        finally:
            if args.redis_url is not None:
                client.close()
    if args.on_stopped:
        module, _, attr = args.on_stopped.rpartition(".")
        getattr(import_module(module), attr)(job, connection)


def job_id_of(client: Client, task_id: str) -> str | None:
    """The id of the RQ job that runs task ``task_id``, if an RQ job submitted it."""
    value = client.redis.hget(client.keys.task(task_id).record, RQ_JOB_FIELD)
    return value.decode() if isinstance(value, bytes) else value


def task_id_of(job: Job) -> str | None:
    """The id of the queueworks task an RQ job runs (once it has started)."""
    value = job.get_meta(refresh=True).get("task_id")
    return str(value) if value else None


def _client(args: Target, connection: redis.Redis) -> Client:
    if args.redis_url is not None:
        return Client.from_url(args.redis_url, prefix=args.prefix)
    return Client(connection, prefix=args.prefix)


def _cancel(task: Task, job_id: str, cause: str) -> None:
    log = structlog.get_logger("queueworks.rq").bind(task_id=task.id, rq_job=job_id)
    try:
        changed = task.cancel()
    except redis.RedisError as exc:
        log.warning("target_task_cancel_failed", cause=cause, error=str(exc))
        return
    log.info("target_task_cancelled", cause=cause, changed=changed)


class _Follower:
    """Submits one target task for its RQ job and follows it to the end."""

    def __init__(self, job: Job, client: Client, args: Target) -> None:
        self.job, self.client, self.args = job, client, args
        self.log = structlog.get_logger("queueworks.rq").bind(rq_job=job.id)
        self.published: dict[str, Any] = {}
        self.task_id: str | None = None  # known before the task is submitted

    def run(self) -> dict[str, Any]:
        # Subscribe before anything else: a stop command sent from now on is seen.
        pubsub = self._subscribe()
        try:
            task = self._attach_or_submit()
            status = self._follow(task, pubsub)
            return self._finish(task, status)
        except (TargetTaskFailed, TargetTaskCancelled):
            raise
        except BaseException as exc:  # job timeout, cold shutdown, a bug: the task goes too
            if self.task_id is not None:
                self._cancel_task(self.client.task(self.task_id), type(exc).__name__)
            raise
        finally:
            if pubsub is not None:
                pubsub.close()

    def _subscribe(self) -> Any:
        """The RQ worker's command channel (stop-job arrives there); None outside a worker."""
        if not self.job.worker_name:
            return None
        pubsub = self.job.connection.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
        pubsub.subscribe(PUBSUB_CHANNEL_TEMPLATE % self.job.worker_name)
        return pubsub

    def _attach_or_submit(self) -> Task:
        """A re-run of a job whose task still runs (work horse lost, job requeued) follows
        that task; otherwise a new task is submitted."""
        task = self._still_running(self.job.get_meta(refresh=True).get("task_id"))
        if task is None:
            task_id = self.task_id = uuid.uuid4().hex[:16]
            # The id is in the meta before the task exists: a stopped callback can find it.
            self._save_meta({"task_id": task_id, "state": "submitting"})
            spec = self.args.task_spec()
            task = self.client.submit(spec, task_id=task_id)
            self.log.info("target_task_submitted", task_id=task_id, name=spec.name)
        else:
            self.task_id = task.id
            self.log.info("target_task_reattached", task_id=task.id)
        self.client.redis.hset(task.keys.record, RQ_JOB_FIELD, self.job.id)
        return task

    def _still_running(self, task_id: object) -> Task | None:
        if not task_id:
            return None
        task = self.client.task(str(task_id))
        try:
            return None if task.status(with_nodes=False).finished else task
        except TaskNotFound:
            return None

    def _follow(self, task: Task, pubsub: Any) -> TaskStatus:
        while True:
            try:
                status = task.status(with_nodes=False)
                self._publish(status)
                if status.finished:
                    return status
                if self._stop_requested(pubsub):
                    self._abandon(task, JOB_STOPPED, stop_job=False)
                if (cause := self._job_gone()) is not None:
                    self._abandon(task, cause, stop_job=True)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self.log.warning("target_task_poll_failed", task_id=task.id, error=str(exc))
                time.sleep(self.args.poll)

    def _cancel_task(self, task: Task, cause: str, *, publish: bool = True) -> None:
        _cancel(task, self.job.id, cause)
        if publish:  # (a meta write would bring back a deleted job's hash)
            with contextlib.suppress(redis.RedisError, TaskNotFound):
                self._publish(task.status(with_nodes=False))

    def _abandon(self, task: Task, cause: str, *, stop_job: bool) -> NoReturn:
        """Cancel the task and end the job as RQ ends a stopped one: ``stopped``, in the
        FailedJobRegistry, never retried. Unless a stop command is what brought us here,
        the job asks its own worker to stop it: RQ would otherwise record it ``failed``
        (and retry it)."""
        self._cancel_task(task, cause, publish=cause != JOB_DELETED)
        if stop_job and self.job.worker_name:
            send_command(self.job.connection, self.job.worker_name, "stop-job", job_id=self.job.id)
        time.sleep(STOP_GRACE)  # the forking worker kills its work horse meanwhile
        raise TargetTaskCancelled(f"target task {task.id}: {cause}")

    def _stop_requested(self, pubsub: Any) -> bool:
        """Wait up to one poll interval for a stop command naming this job."""
        if pubsub is None:
            time.sleep(self.args.poll)
            return False
        message = pubsub.get_message(timeout=self.args.poll)
        if not message or message.get("type") != "message":
            return False
        try:
            command = json.loads(message["data"])
        except (TypeError, ValueError):
            return False
        return bool(
            isinstance(command, dict)
            and command.get("command") in STOP_COMMANDS
            and command.get("job_id") == self.job.id
        )

    def _job_gone(self) -> str | None:
        """``job.cancel()`` or ``job.delete()`` while it runs (RQ does not stop it)."""
        try:
            status = self.job.get_status(refresh=True)
        except InvalidJobOperation:
            return JOB_DELETED
        return JOB_CANCELED if status == JobStatus.CANCELED else None

    def _publish(self, status: TaskStatus) -> None:
        fields = {
            "task_id": status.id,
            "state": status.state.value,
            "total": status.total,
            "done": status.done,
            "dead": status.dead,
            "progress": round(status.progress, 4),
        }
        if fields != self.published:
            self._save_meta(fields)
            self.published = fields

    def _save_meta(self, fields: dict[str, Any]) -> None:
        """Update our fields only, keeping whatever else is in the meta."""
        self.job.get_meta(refresh=True).update(fields)
        self.job.save_meta()  # type: ignore[no-untyped-call, unused-ignore]

    def _finish(self, task: Task, status: TaskStatus) -> dict[str, Any]:
        letters = task.dead_letters(count=FIRST_DEAD_LETTERS) if status.dead else []
        summary = {
            "task_id": status.id,
            "name": status.name,
            "state": status.state.value,
            "total": status.total,
            "done": status.done,
            "dead": status.dead,
            "seconds": round((status.finished_at or time.time()) - status.created_at, 3),
            "dead_letters": [
                {"index": d.index, "reason": d.reason, "error": _last_line(d.error)}
                for d in letters
            ],
        }
        self.log.info("target_task_finished", task_id=status.id, state=status.state.value)
        if status.state == TaskState.COMPLETED:
            return summary
        if status.state == TaskState.CANCELLED:
            self._abandon(task, TASK_CANCELLED, stop_job=True)
        raise TargetTaskFailed(dead_letter_summary(summary, status.error))


def dead_letter_summary(summary: dict[str, Any], error: str | None = None) -> str:
    """One paragraph: why the task failed, how many dead letters, and the first few."""
    head = (
        f"target task {summary['task_id']} ({summary['name']}) {summary['state']}"
        f"{': ' + error if error else ''}; {summary['dead']} of {summary['total']} subtasks "
        f"dead-lettered, {summary['done']} done"
    )
    firsts = [f"#{d['index']} {d['reason']}: {d['error']}" for d in summary.get("dead_letters", [])]
    return head + ("; first: " + " | ".join(firsts) if firsts else "")


def _last_line(error: str) -> str:
    lines = [line for line in error.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
