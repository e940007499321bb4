"""The public client: submit target tasks, watch them, read their results."""

from __future__ import annotations

import time
from typing import Any, TypeVar, Unpack

from redis.cluster import RedisCluster

from queueworks.client.client_plans import (
    plan_drain_worker,
    plan_task_count,
    plan_tasks,
    plan_workers,
    worker_records,
)
from queueworks.client.queue_handle import Job, Queue, open_queue
from queueworks.errors import EvictingRedis, NotReplicated, SubmitError, TaskNotFound
from queueworks.logs import get_logger
from queueworks.protocol.keys import Keys, check_task_id
from queueworks.protocol.models import JobStatus, QueueStatus, TaskSpec, TaskStatus, WorkerRecord
from queueworks.protocol.records import BadRecord
from queueworks.queue.queue_plans import plan_job_status_of, plan_queues, plan_running_of
from queueworks.queue.queue_settings import DEFAULTS, QueueOptions, check_queue_settings
from queueworks.queue.queues import RUNNING_SHOWN, UNSET, job_ref
from queueworks.scripts.bound import Scripts
from queueworks.settings import Settings
from queueworks.task.submit import (
    SUBMIT_BATCH,
    SUBMIT_LEASE_MS,
    SUBMIT_PIPELINE,
    check_replicated,
    plan_submit,
    submit_task_id,
    sync_subtasks,
)
from queueworks.task.tasks import Task
from queueworks.transport.connection import Connection, connect
from queueworks.transport.eviction import CLIENT_OVERRIDE, judge, read_policies
from queueworks.transport.lost_workers import WINDOW, LostWorker, plan_lost_workers
from queueworks.transport.plans import Plan
from queueworks.transport.runner import run
from queueworks.transport.wire import Line

__all__ = [
    "SUBMIT_BATCH",
    "SUBMIT_LEASE_MS",
    "SUBMIT_PIPELINE",
    "BadRecord",
    "Client",
    "EvictingRedis",
    "NotReplicated",
    "SubmitError",
    "Task",
    "TaskNotFound",
    "sync_subtasks",
    "worker_records",
]

T = TypeVar("T")


class Client:
    """Entry point for users: ``Client.from_url("redis://localhost:6379/0")``.

    Its first write (``submit``, ``queue``, a task's ``cancel``...) raises ``EvictingRedis``
    if the server's ``maxmemory-policy`` is not ``noeviction`` (checked once per client),
    unless it was made with ``allow_eviction=True``."""

    def __init__(
        self, connection: Connection, *, prefix: str = "qw", allow_eviction: bool = False
    ) -> None:
        self.redis = connection
        self.keys = Keys(prefix)
        self.scripts = Scripts(connection)
        self.line = Line.of(connection)  # the hot path of enqueue (``queueworks.transport.wire``)
        self.allow_eviction = allow_eviction
        self._eviction_checked = False

    @classmethod
    def from_url(
        cls, url: str, *, prefix: str = "qw", allow_eviction: bool = False, **connect_options: Any
    ) -> Client:
        return cls(connect(url, **connect_options), prefix=prefix, allow_eviction=allow_eviction)

    @classmethod
    def from_env(cls, **connect_options: Any) -> Client:
        """A client made as the ``queueworks`` command makes one: the URL of
        ``QUEUEWORKS_REDIS_URL`` (default ``redis://localhost:6379/0``), the prefix of
        ``QUEUEWORKS_PREFIX`` (``qw``), and ``QUEUEWORKS_SSL_*`` and
        ``QUEUEWORKS_ALLOW_EVICTION``, read at this call; ``connect_options`` as
        ``from_url``'s."""
        url, options = env_options(connect_options)
        return cls.from_url(url, **options)

    def check_eviction(self) -> None:
        """Raise ``EvictingRedis`` if the server may evict keys (its ``maxmemory-policy``),
        unless ``allow_eviction``; read once per client, at its first write (one round trip
        per primary), then remembered."""
        if not self._eviction_checked:
            policies = read_policies(self.redis)
            judge(policies, allow=self.allow_eviction, override=CLIENT_OVERRIDE, log=client_log())
            self._eviction_checked = True

    def close(self) -> None:
        if self.line is not None:
            self.line.close()
        self.redis.close()

    def _run(self, plan: Plan[T]) -> T:
        return run(self.redis, self.scripts, plan)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submitting -----------------------------------------------------------------------

    def submit(
        self,
        spec: TaskSpec,
        *,
        task_id: str | None = None,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> Task:
        """Split ``spec`` onto its stream(s) and queue it; returns a handle to the task.

        Subtasks are streamed in pipelined batches: a generator is never held in memory as
        a whole. Raises ``SubmitError`` naming the bad subtask; nothing is left behind.
        A task of at most ``SUBMIT_BATCH`` subtasks is written in one atomic step: one
        round trip on one server, two on a cluster.

        ``wait_replicas=n``: return only once ``n`` replicas of every primary that holds the
        task (its keys, the queue, the events) have it (``WAIT n``, up to ``wait_timeout``
        s); else raise ``NotReplicated`` (the task exists; a failover may still lose it).
        """
        tid = submit_task_id(spec, task_id, wait_replicas, wait_timeout)
        sync_subtasks(spec)
        self.check_eviction()
        cluster = isinstance(self.redis, RedisCluster)
        plan = plan_submit(self.keys, spec, tid, wait_replicas, wait_timeout, cluster)
        acked = self._run(plan)
        task = Task(self, tid)
        check_replicated(task, acked, wait_replicas, wait_timeout)
        return task

    # -- reading --------------------------------------------------------------------------

    def task(self, task_id: str) -> Task:
        return Task(self, check_task_id(task_id))

    # -- queues ---------------------------------------------------------------------------

    def queue(self, name: str, *, reopen: bool = False, **settings: Unpack[QueueOptions]) -> Queue:
        """Create the queue ``name`` or open it (idempotent). Settings not given are the
        queue's own (or the defaults, when it is created: ``min_nodes=1``, no
        ``max_nodes``, ``priority=0``, ``max_attempts=3``, ``job_timeout=60`` s,
        ``result_ttl`` a day); given ones must match an existing
        queue's (``ValueError`` names the ones that do not). A queue that was cancelled
        (or failed) takes no jobs: opening it is a ``ValueError``, unless ``reopen=True``,
        which makes it open again (queued, then running), with its settings, counts and
        jobs as they were."""
        given = given_settings(**settings)
        name = check_task_id(name, "queue name")
        self.check_eviction()
        return open_queue(self, name, given, reopen)

    def job(self, ref: str) -> Job:
        """A handle to the job ``"QUEUE/JOB_ID"`` (no I/O: ``status()`` raises
        ``LookupError`` for no such job); ``ValueError`` for a malformed reference."""
        name, job_id = job_ref(ref)
        return Queue(self, name, DEFAULTS, revives=False).job(job_id)

    def queues(self) -> list[QueueStatus]:
        """Every queue that still exists, by name."""
        return self._run(plan_queues(self.keys))

    def job_status(self, queue: str, job_id: str) -> JobStatus:
        """A job's status by its queue's name, without opening the queue; ``LookupError``
        if the queue has no such job."""
        return self._run(plan_job_status_of(self.keys, queue, job_id))

    def running_jobs(self, queue: str, limit: int = RUNNING_SHOWN) -> list[JobStatus]:
        """The status of up to ``limit`` jobs the members of ``queue`` run now (with their
        progress), without opening it: [] for a queue that has none, or is no queue."""
        return self._run(plan_running_of(self.keys, queue, limit))

    def tasks(
        self, *, limit: int | None = None, offset: int = 0, newest_first: bool = False
    ) -> list[TaskStatus]:
        """Tasks known to Redis (active ones and finished ones not yet expired), oldest
        first (``newest_first``: the other way), from the index ``qw:tasks``: ``limit``
        of them (None = all) after skipping ``offset``. Costs one round trip for the page
        plus one pipeline for its records."""
        return self._run(plan_tasks(self.keys, limit, offset, newest_first))

    def task_count(self) -> int:
        """How many tasks the index lists (finished ones until they expire)."""
        return self._run(plan_task_count(self.keys))

    def workers(self) -> list[WorkerRecord]:
        return self._run(plan_workers(self.keys))

    def lost_workers(self, within: float = WINDOW) -> list[LostWorker]:
        """Workers found dead (heartbeat gone) in the last ``within`` seconds, newest
        first (at most 50), each with what its task and queues reclaimed from it."""
        return self._run(plan_lost_workers(self.keys, time.time(), within))

    def drain_worker(self, worker_id: str) -> None:
        """Ask a worker to leave gracefully and exit (as SIGTERM would), within a tick."""
        self.check_eviction()
        self._run(plan_drain_worker(self.keys, worker_id))


# -- what Client and AsyncClient share: no I/O ----------------------------------------------


def env_options(connect_options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The URL and ``from_url`` options of ``from_env``: the variables the command reads
    (``queueworks.settings.Settings``), then ``connect_options`` over them."""
    s = Settings()
    options: dict[str, Any] = {"prefix": s.prefix, "allow_eviction": s.allow_eviction}
    options |= {"ssl_ca_certs": s.ssl_ca_certs, "ssl_certfile": s.ssl_certfile}
    options |= {"ssl_keyfile": s.ssl_keyfile}
    return s.redis_url, options | connect_options


def client_log() -> Any:
    """The clients' logger (their one warning: a policy that cannot be read)."""
    return get_logger(component="client")


def given_settings(**settings: Any) -> dict[str, Any]:
    """The queue settings a caller gave (the rest are ``UNSET``), checked: ``ValueError``
    naming the first that is no value in range."""
    return check_queue_settings({k: v for k, v in settings.items() if v is not UNSET})
