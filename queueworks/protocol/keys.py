"""The Redis key schema: the only place that builds a key string.

Every per-task key carries the task id in a Redis Cluster hash tag ``{T}``, so all keys of
one task live in one slot and one Lua script may touch them all.

=================================  ============  =================================================
key                                type          meaning
=================================  ============  =================================================
``qw:task:{T}``                    hash          task record: spec JSON, state, total, done,
                                                 dead, epoch, priority, min/max nodes, times
``qw:task:{T}:stream``             stream        subtask messages for any member; group ``workers``
``qw:task:{T}:p:<k>``              stream        partition k of a partitioned task (same group)
``qw:task:{Q}:band:<N>``           stream        a queue's jobs of priority N (not 0: those are on
                                                 its own stream), same group; made (with the
                                                 group) by the first enqueue of that priority
``qw:task:{Q}:bands``              set           the priorities other than 0 a queue's jobs have
                                                 used: the bands its members read (each one
                                                 added bumps the record's ``bands`` version)
``qw:task:{T}:members``            zset          member worker ids, score = join sequence (= epoch
                                                 at join); ascending order = rank
``qw:task:{T}:hb:<W>``             string + TTL  member W's heartbeat in this task (a queue's
                                                 members keep none: the pool heartbeat is
                                                 their liveness; the join's runs out)
``qw:task:{T}:epoch``              string (int)  generation: INCR on every membership change
``qw:task:{T}:confirm``            hash          worker -> last epoch it settled in (partition
                                                 barrier)
``qw:task:{T}:results``            hash          subtask index -> result JSON (written once)
``qw:task:{T}:dead``               stream        dead-lettered subtasks: reason, error, attempts
                                                 (and ``rejected`` entries that were no subtask)
``qw:task:{T}:settled``            string        bitmap: bit i set once index i has a result or
                                                 a dead letter (completion is by index)
``qw:task:{T}:refused``            hash          worker -> why it cannot run this task's
                                                 handler (JSON); it is not assigned it again
``qw:task:{T}:history``            stream        this task's rebalances (epoch, cause, pause)
``qw:task:{Q}:job:<J>``            hash          a queue's job J: state, entry, handler, times,
                                                 attempts, payload, result or error; expires
                                                 ``result_ttl`` after it finished (an
                                                 unfinished job's: with its finished queue)
``qw:task:{Q}:scheduled``          zset          a queue's delayed jobs, score = when they run
``qw:task:{Q}:handlers``           set           the handlers a queue's jobs have named
``qw:task:{Q}:aside``              set           the handlers whose jobs a queue set aside (a
                                                 member read them and may not run them)
``qw:task:{Q}:aside:<H>``          stream        the jobs of handler H set aside: read (group
                                                 ``workers``) by members that may run H; deleted
                                                 once empty
``qw:task:{Q}:bucket``             hash + TTL    a queue's rate_limit token bucket: tokens, ms of
                                                 the last refill, when a read last found it
                                                 empty (absent: full; expires once full)
``qw:task:{Q}:groups``             hash          a queue's group slots: group -> jobs holding one
``qw:task:{Q}:groups:held``        hash          job id -> the group whose slot it holds (until
                                                 it is settled, retried later or cancelled)
``qw:task:{Q}:groups:waiting``     hash          group -> its jobs waiting for a slot (named
                                                 while its wait list exists, even at 0)
``qw:task:{Q}:groups:wait:<G>``    list          group G's jobs waiting for a slot, oldest first
                                                 (each: its record key and entry fields, JSON);
                                                 expires with the queue (``group_waits``)
``qw:task:{Q}:unique:<K>``         string        unique key K of a queue's jobs: the id of the job
                                                 that holds it while it is live (no TTL; with
                                                 its finished queue), or for ``unique_for`` s
                                                 after it finished (TTL)
``qw:task:{Q}:deps:<J>``           set           a deferred job J's dependencies still awaited
                                                 (``Q/J`` for a job, ``T`` for a task); expires
                                                 with its finished queue
``qw:task:{Q}:deferred``           zset          a queue's deferred jobs (waiting for others),
                                                 score = when they were enqueued
``qw:task:{Q}:done``               list          the ids of a queue's jobs done most recently,
                                                 newest first (capped: ``DONE_KEPT``)
``qw:task:{Q}:cancelled``          list          the ids of a queue's jobs cancelled most
                                                 recently, newest first (capped: ``DONE_KEPT``)
``qw:task:{T}:waiters``            hash          the jobs waiting for this one's outcome: a job
                                                 id (``*``: the task itself) -> its dependents
                                                 (``Q/J``, space-separated)
``qw:task:{T}:released``           list          outbox: dependents to release (written by the
                                                 outcome's atomic step, drained in theirs)
``qw:task:{Q}:latency``            hash          a queue's enqueue -> start histogram (buckets)
``qw:task:{Q}:rate``               hash          a queue's jobs finished per second (60 s)
``qw:task:{Q}:synced``             string + TTL  a queue with ``wait_replicas``: set (1 s) by a
                                                 result-waiter that saw a job finish, a write
                                                 of its own that its WAIT then covers (and the
                                                 settle it read, replicated before it)
``qw:task:{Q}:schedules``          hash          a queue's schedules: name -> definition JSON
                                                 (handler, payload, every or cron)
``qw:task:{Q}:schedules:due``      zset          a queue's schedules by next due time (ms): the
                                                 truth the fire script checks and advances
``qw:task:{Q}:schedules:last``     hash          schedule name -> ``<due s> <job id>`` of the
                                                 last job it enqueued
``qw:task:{T}:steps``              hash          step mode: each step's shards and decision
``qw:task:{T}:rdzv``               string + TTL  step mode: the leader's c10d store address
``qw:task:{T}:checkpoint``         string        step mode: the last checkpoint (if in Redis)
``qw:queue``                       zset          active tasks, score = created_at
``qw:tasks``                       zset          every task not yet expired, score = created_at:
                                                 the index that lists and pages them
``qw:tasks:expiry``                zset          finished tasks, score = when their keys expire
                                                 (the controller drops them from the index then)
``qw:queues``                      set           the names of every queue (a queue is a task)
``qw:queues:expiring``             zset          finished queues whose unfinished jobs' keys the
                                                 leader is giving the queue's expiry
                                                 (``queueworks.queue.job_keys``), score = when the
                                                 queue's keys expire
``qw:schedules``                   zset          every schedule, ``<queue>/<name>``, score = its
                                                 next due time (ms): the one read of a
                                                 controller pass (its own slot; the queue's
                                                 ``schedules:due`` is checked when one fires)
``qw:deps:tasks``                  set           tasks and queues that jobs wait for (their
                                                 outboxes' backstop looks there)
``qw:throughput:minutes``          hash          subtasks and jobs settled and dead per minute:
                                                 minute (epoch s // 60) -> "settled dead",
                                                 written once a minute by a dashboard that
                                                 watched it whole (the last day kept;
                                                 ``dashboard.history``)
``qw:workers``                     zset          every known worker, score = last heartbeat (s)
``qw:workers:lost``                stream        workers found dead (heartbeat gone), newest last:
                                                 when, host, pid, task, queues (capped ~50;
                                                 ``queueworks.transport.lost_workers``)
``qw:worker:<W>``                  hash          host, pid, labels, queues, member_of, state,
                                                 task, rank, current (``records``)
``qw:worker:<W>:hb``               string + TTL  pool heartbeat of W
``qw:worker:<W>:queues``           set           the queues W joined and may hold jobs of
                                                 (added before it reads one, removed after it
                                                 left); taken whole by whoever finds W dead
``qw:worker:<W>:assign``           string        task id the controller gave W ("" = idle)
``qw:pools``                       zset          every worker pool (``worker --processes``), score =
                                                 its supervisor's last write (s)
``qw:pool:<P>``                    string + TTL  pool P's record as JSON: members, restarts
                                                 (``queueworks.transport.pools``); TTL a few
                                                 intervals
``qw:worker:<W>:stop``             list + TTL    jobs W is to stop ("QUEUE\tJOB_ID": cancelled while
                                                 they ran), taken by its heartbeat; 60 s
``qw:controller:leader``           string + TTL  controller leader lease: ``<controller id>#<term>``
``qw:autoscale:wanted``            string + TTL  the workers wanted per node selector (JSON,
                                                 ``queueworks.protocol.wanted``), by the leader
``qw:controller:term:{<lease>}``   string (int)  the lease's term counter; its tag is the lease's
                                                 key, so both share a slot
``qw:fence:{<tag>}``               string (int)  cluster only, one per slot: the highest term that
                                                 wrote or sealed the slot (fenced writes)
``qw:events``                      stream        what happened (capped ~10,000 entries)
=================================  ============  =================================================

Keys of a finished task expire after ``result_ttl``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from queueworks.protocol.priorities import DEFAULT, HIGHEST, LOWEST, priority_of_id
from queueworks.protocol.validate import check_name, check_prefix
from queueworks.protocol.validate import check_worker_id as check_worker_id

PARKED = "_parked"  # the consumer of every group that holds entries handed back by a leave
GROUP = "workers"  # the consumer group of every task stream: one read covers many queues


def check_task_id(task_id: str, what: str = "task id") -> str:
    """Task ids (and queue names) go into hash tags and group names: one small safe
    pattern, ``validate.NAME_PATTERN``."""
    return check_name(task_id, what)


@dataclass(frozen=True)
class TaskKeys:
    """All keys of one task; every one shares the ``{task_id}`` hash tag."""

    prefix: str
    task_id: str

    @property
    def _base(self) -> str:
        return f"{self.prefix}:task:{{{self.task_id}}}"

    @property
    def record(self) -> str:
        return self._base

    @property
    def stream(self) -> str:
        return f"{self._base}:stream"

    def partition(self, k: int) -> str:
        return f"{self._base}:p:{k}"

    def band(self, priority: int) -> str:
        """The stream of a queue's jobs of ``priority`` (``queueworks.protocol.priorities``)."""
        return self.stream if priority == DEFAULT else f"{self._base}:band:{priority}"

    @property
    def bands(self) -> str:
        return f"{self._base}:bands"

    @property
    def band_pattern(self) -> str:
        """Every band's stream of the queue (a pattern: with ``task_id`` ``*``, every
        queue's), as keyspace notifications name them."""
        return f"{self._base}:band:*"

    def band_streams(self) -> list[str]:
        """Every band's stream but the queue's own, highest first."""
        return [self.band(p) for p in range(HIGHEST, LOWEST - 1, -1) if p != DEFAULT]

    def stream_of(self, job_id: str) -> str:
        """The stream a job waits on (not set aside): its band's, which its id says."""
        priority = priority_of_id(job_id)
        return self.stream if priority == DEFAULT else self.band(priority)

    def read_order(self, bands: Iterable[int], aside: Iterable[str] = ()) -> list[str]:
        """The streams a member of the queue reads, in the order it reads them: the bands
        above 0 (``bands``: those in use), highest first, then its own stream, then the
        aside streams ``aside``, then the bands below 0."""
        ordered = sorted(set(bands), reverse=True)
        high = [self.band(p) for p in ordered if p > DEFAULT]
        low = [self.band(p) for p in ordered if p < DEFAULT]
        return [*high, self.stream, *aside, *low]

    @property
    def members(self) -> str:
        return f"{self._base}:members"

    def heartbeat(self, worker_id: str) -> str:
        return f"{self._base}:hb:{worker_id}"

    @property
    def heartbeat_prefix(self) -> str:
        return f"{self._base}:hb:"

    @property
    def epoch(self) -> str:
        return f"{self._base}:epoch"

    @property
    def confirm(self) -> str:
        return f"{self._base}:confirm"

    @property
    def results(self) -> str:
        return f"{self._base}:results"

    @property
    def dead(self) -> str:
        return f"{self._base}:dead"

    @property
    def settled(self) -> str:
        return f"{self._base}:settled"

    @property
    def refused(self) -> str:
        return f"{self._base}:refused"

    @property
    def history(self) -> str:
        return f"{self._base}:history"

    @property
    def synced(self) -> str:
        return f"{self._base}:synced"

    @property
    def steps(self) -> str:
        return f"{self._base}:steps"

    @property
    def rendezvous(self) -> str:
        return f"{self._base}:rdzv"

    @property
    def checkpoint(self) -> str:
        return f"{self._base}:checkpoint"

    def job(self, job_id: str) -> str:
        return f"{self._base}:job:{job_id}"  # = job_prefix + job_id

    @property
    def job_prefix(self) -> str:
        return f"{self._base}:job:"

    @property
    def scheduled(self) -> str:
        return f"{self._base}:scheduled"

    @property
    def handlers(self) -> str:
        return f"{self._base}:handlers"

    @property
    def schedules(self) -> str:
        return f"{self._base}:schedules"

    @property
    def schedules_due(self) -> str:
        return f"{self._base}:schedules:due"

    @property
    def schedules_last(self) -> str:
        return f"{self._base}:schedules:last"

    @property
    def aside(self) -> str:
        return f"{self._base}:aside"

    def aside_stream(self, handler: str) -> str:
        """Where a queue's jobs of ``handler`` wait when a member that may not run it read
        them (a valid ``module:function`` path: no brace can break the hash tag)."""
        return f"{self._base}:aside:{handler}"

    @property
    def bucket(self) -> str:
        """The queue's rate_limit token bucket (``rate_read.lua``)."""
        return f"{self._base}:bucket"

    @property
    def groups(self) -> str:
        """Group -> slots held (``group_take.lua``, ``group_release.lua``)."""
        return f"{self._base}:groups"

    @property
    def groups_held(self) -> str:
        return f"{self._base}:groups:held"

    @property
    def groups_waiting(self) -> str:
        return f"{self._base}:groups:waiting"

    def group_wait(self, group: str) -> str:
        """Group ``group``'s jobs waiting for a slot (a checked group name,
        ``job_options.check_group``: no brace can break the hash tag)."""
        return f"{self._base}:groups:wait:{group}"

    def group_waits(self, groups: Iterable[str]) -> list[str]:
        """The wait lists of ``groups`` (the fields of ``groups_waiting``: it names every
        wait list of the queue), which expire and are kept with its other keys."""
        return [self.group_wait(g) for g in groups]

    def unique(self, key: str) -> str:
        """The index of a unique key of the queue's jobs: the id of the job holding it (a
        checked key, ``job_options.check_key``: a brace in it cannot break the hash tag,
        which is the key's first ``{...}``)."""
        return f"{self._base}:unique:{key}"

    def deps(self, job_id: str) -> str:
        """A deferred job's dependencies still awaited (``queueworks.task.dependencies``)."""
        return f"{self._base}:deps:{job_id}"

    @property
    def deferred(self) -> str:
        return f"{self._base}:deferred"

    @property
    def done(self) -> str:
        """The newest done jobs' ids (``settle_jobs.lua``): the index of the done list."""
        return f"{self._base}:done"

    @property
    def cancelled(self) -> str:
        """The newest cancelled jobs' ids (``cancel_job.lua``): the cancelled list's index."""
        return f"{self._base}:cancelled"

    @property
    def waiters(self) -> str:
        return f"{self._base}:waiters"

    @property
    def released(self) -> str:
        return f"{self._base}:released"

    @property
    def latency(self) -> str:
        return f"{self._base}:latency"

    @property
    def rate(self) -> str:
        return f"{self._base}:rate"

    @property
    def group(self) -> str:
        """The consumer group of every stream of this task: one name for every task, so one
        ``XREADGROUP`` covers the streams of many queues (a worker serves them together)."""
        return GROUP

    def streams(self, partitions: int) -> list[str]:
        """The subtask streams: one, or one per partition."""
        if partitions <= 0:
            return [self.stream]
        return [self.partition(k) for k in range(partitions)]

    def all(self, partitions: int) -> list[str]:
        """Every key of the task that holds data (for expiry when it finishes)."""
        return [
            self.record,
            *self.streams(partitions),
            *self.band_streams(),
            self.bands,
            self.members,
            self.epoch,
            self.confirm,
            self.results,
            self.dead,
            self.settled,
            self.refused,
            self.history,
            self.steps,
            self.rendezvous,
            self.checkpoint,
            self.scheduled,
            self.handlers,
            self.aside,
            self.latency,
            self.rate,
            self.bucket,
            self.groups,
            self.groups_held,
            self.groups_waiting,
            self.schedules,
            self.schedules_due,
            self.schedules_last,
            self.deferred,
            self.done,
            self.cancelled,
            self.waiters,
            self.released,
        ]


@dataclass(frozen=True)
class Keys:
    """The key schema under one prefix (default ``qw``)."""

    prefix: str = "qw"

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    def task(self, task_id: str) -> TaskKeys:
        return TaskKeys(self.prefix, task_id)

    @property
    def task_pattern(self) -> str:
        return f"{self.prefix}:task:{{*}}"

    def task_id_from_record(self, key: str) -> str:
        """Inverse of ``TaskKeys.record``."""
        return key[len(self.prefix) + len(":task:{") : -1]

    @property
    def queue(self) -> str:
        return f"{self.prefix}:queue"

    @property
    def queues(self) -> str:
        return f"{self.prefix}:queues"

    @property
    def queues_expiring(self) -> str:
        """Finished queues whose jobs' keys are still to expire (``controller.leftovers``)."""
        return f"{self.prefix}:queues:expiring"

    @property
    def schedules(self) -> str:
        """The global index of every queue's schedules (``queueworks.queue.schedules``)."""
        return f"{self.prefix}:schedules"

    @property
    def dep_tasks(self) -> str:
        return f"{self.prefix}:deps:tasks"

    @property
    def workers(self) -> str:
        return f"{self.prefix}:workers"

    @property
    def workers_lost(self) -> str:
        return f"{self.prefix}:workers:lost"

    @property
    def throughput_minutes(self) -> str:
        """Settled and dead per minute (``dashboard.history``)."""
        return f"{self.prefix}:throughput:minutes"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    def worker_heartbeat(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}:hb"

    def worker_queues(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}:queues"

    def assign(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}:assign"

    def worker_stops(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}:stop"

    @property
    def pools(self) -> str:
        return f"{self.prefix}:pools"

    def pool(self, pool_id: str) -> str:
        return f"{self.prefix}:pool:{pool_id}"

    @property
    def tasks(self) -> str:
        return f"{self.prefix}:tasks"

    @property
    def tasks_expiry(self) -> str:
        return f"{self.prefix}:tasks:expiry"

    @property
    def leader(self) -> str:
        return f"{self.prefix}:controller:leader"

    @property
    def leader_term(self) -> str:
        """In the lease's slot (a key without braces hashes as the tag ``{key}`` does), and
        under the prefix (an ACL may allow this deployment's keys only)."""
        return f"{self.prefix}:controller:term:{{{self.leader}}}"

    def fence(self, tag: str) -> str:
        """The term key of the cluster slot that ``tag`` hashes to (``controller.fence``)."""
        return f"{self.prefix}:fence:{{{tag}}}"

    @property
    def wanted(self) -> str:
        """The workers wanted per node selector (``queueworks.protocol.wanted``)."""
        return f"{self.prefix}:autoscale:wanted"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"
