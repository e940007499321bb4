"""One job's actions on the dashboard (``POST /queues/{q}/jobs/{id}/ACTION``, and under
``/api``): ``cancel`` a job not finished (as ``job.cancel()``: a running one is stopped),
``requeue`` a dead one (its dead letter, found by the job's id), ``delete`` a finished one
(dead, done or cancelled: its record, its place in its state's list and its dead letters
go; it stays counted). A job in a state the action does not take is a ``Conflict`` (409) saying so.
"""

from __future__ import annotations

from typing import Any

import redis

from queueworks.dashboard.state import Dashboard
from queueworks.protocol.jobrecords import DEAD_JOB, JOB_STATE
from queueworks.protocol.messages import text
from queueworks.protocol.models import JobDetail, JobState

FINISHED = (JobState.DEAD, JobState.DONE, JobState.CANCELLED)
LETTERS_READ = 1000  # dead letters read a round trip, looking for a job's


class Conflict(ValueError):
    """The job is not in a state the action takes (409), with a message for the operator."""


def _job(d: Dashboard, name: str, job_id: str) -> JobDetail:
    return d.queues.job(name, job_id)  # TaskNotFound (404) for no such queue or job


def cancel(d: Dashboard, name: str, job_id: str) -> dict[str, Any]:
    """Cancel job ``job_id`` as ``job.cancel()`` does: one not started never runs, a running
    one is stopped (its worker told to stop the call). A finished job is a ``Conflict``."""
    job = _job(d, name, job_id)
    if job.state.finished:
        raise Conflict(f"job {job_id} is {job.state.value}: it had finished, nothing to cancel")
    if not d.client.queue(name).job(job_id).cancel():
        raise Conflict(f"job {job_id} had finished meanwhile: it was not cancelled")
    return {"job": job_id, "cancelled": True, "message": f"Job {job_id} cancelled."}


def dead_letters_of(r: Any, stream: str, job_id: str) -> list[str]:
    """The entries of dead-letter ``stream`` that name job ``job_id``, newest first (the
    stream is capped: read ``LETTERS_READ`` a round trip)."""
    found, last = [], "+"
    wanted = job_id.encode()
    while True:
        batch = r.xrevrange(stream, last, "-", count=LETTERS_READ)
        for entry_id, raw in batch:
            if raw.get(DEAD_JOB.encode()) == wanted:
                found.append(text(entry_id))
        if len(batch) < LETTERS_READ:
            return found
        last = f"({text(batch[-1][0])}"


def requeue(d: Dashboard, name: str, job_id: str) -> dict[str, Any]:
    job = _job(d, name, job_id)
    if job.state != JobState.DEAD:
        raise Conflict(f"job {job_id} is {job.state.value}: only a dead job is requeued")
    letters = dead_letters_of(d.client.redis, d.client.keys.task(name).dead, job_id)
    if not letters:
        raise Conflict(f"job {job_id} has no dead letter kept: nothing can requeue it")
    got = d.admin.requeue_job(name, letters[0])
    return {"job": got.job, "entry": got.new_entry, "message": f"Job {got.job} requeued."}


def delete(d: Dashboard, name: str, job_id: str) -> dict[str, Any]:
    """Delete finished job ``job_id``: its record (only while its state is still the one
    read: a job requeued meanwhile is left alone), its id in the done and cancelled lists,
    its dead letters."""
    job = _job(d, name, job_id)
    if job.state not in FINISHED:
        raise Conflict(f"job {job_id} is {job.state.value}: only a finished job is deleted")
    qk = d.client.keys.task(name)
    letters = dead_letters_of(d.client.redis, qk.dead, job_id) if job.state == JobState.DEAD else []
    with d.client.redis.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(qk.job(job_id))
            state = pipe.hget(qk.job(job_id), JOB_STATE)
            if state is not None and text(state) != job.state.value:
                raise Conflict(f"job {job_id} is {text(state)[:40]} now: it was not deleted")
            pipe.multi()
            pipe.delete(qk.job(job_id))
            pipe.lrem(qk.done, 1, job_id)
            pipe.lrem(qk.cancelled, 1, job_id)
            if letters:
                pipe.xdel(qk.dead, *letters)
            pipe.execute()
        except redis.WatchError:
            raise Conflict(f"job {job_id} changed meanwhile: it was not deleted") from None
    return {"job": job_id, "deleted": True, "message": f"Job {job_id} deleted."}
