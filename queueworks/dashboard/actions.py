"""Operator actions (POST): cancel, priority, resize, requeue / delete a dead letter, drain;
and a queue's: requeue / delete a dead letter (``/queues/{name}/dead/{entry}/...``), all of
them (``/queues/{name}/dead/requeue-all``, ``delete-all``), pause / resume / empty and its
live settings (``/queues/{name}/...``), one job's: run a scheduled job now, cancel (a running
one is stopped), requeue, delete (``/queues/{name}/jobs/{id}/...``: ``job_actions``). A
queue's priority, bounds and cancel are its task's, ``/tasks/{name}/...``.

Each action has two addresses: ``/api/...`` answers JSON (scripts, and the page's own
JavaScript), the same path without ``/api`` answers a redirect back to the page (forms
without JavaScript). Both need the token when one is set and the CSRF token unless the
token came as a bearer header (see ``security``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from queueworks.dashboard import job_actions
from queueworks.dashboard.reader import ENTRY_ID
from queueworks.dashboard.security import CSRF_FIELD, CSRF_HEADER, local_path, same_origin
from queueworks.dashboard.state import Dashboard, dash_of
from queueworks.dashboard.templating import json_response
from queueworks.errors import AdminError, TaskNotFound
from queueworks.protocol.keys import check_task_id, check_worker_id
from queueworks.queue.configure import plan_configure
from queueworks.queue.queue_admin import (
    plan_delete_dead,
    plan_empty,
    plan_pause,
    plan_requeue_dead,
    plan_run_now,
)
from queueworks.queue.queue_settings import LIVE, SETTINGS
from queueworks.transport.plans import Plan
from queueworks.transport.runner import run

T = TypeVar("T")

MAX_BODY = 64 * 1024


class ActionError(ValueError):
    """A request the action cannot carry out (400), with a message for the operator."""


Action = Callable[[Dashboard, dict[str, str], dict[str, Any]], dict[str, Any]]


def _task(d: Dashboard, params: dict[str, str]) -> Any:
    task = d.client.task(check_task_id(params["task_id"]))
    task.status(with_nodes=False)  # TaskNotFound -> 404
    return task


def _setting(form: dict[str, Any], name: str) -> Any:
    """Queue setting ``name`` (``QueueSettings``) from a form: required unless the setting
    may be None (then "" is None); an integer one must be an integer. Its bounds are
    checked by the action that takes it."""
    declared = SETTINGS[name]
    raw = form.get(name)
    if raw is None or raw == "":
        if declared.optional:
            return None
        raise ActionError(f"{name} is required")
    what = "an integer" if declared.kind is int else "a number"
    try:
        return declared.kind(raw)
    except (TypeError, ValueError):
        raise ActionError(f"{name} must be {what}, got {raw!r}") from None


def cancel(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    task = _task(d, params)
    changed = task.cancel()
    msg = "Task cancelled." if changed else "The task had already finished."
    return {"cancelled": changed, "message": msg}


def priority(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    task = _task(d, params)
    value = _setting(form, "priority")
    task.set_priority(value)
    return {"priority": value, "message": f"Priority set to {value}."}


def resize(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    task = _task(d, params)
    low, high = _setting(form, "min_nodes"), _setting(form, "max_nodes")
    task.resize(low, high)
    shown = "unbounded" if high is None else str(high)
    return {
        "min_nodes": low,
        "max_nodes": high,
        "message": f"Node set bounds set to min {low}, max {shown}.",
    }


def _entry(params: dict[str, str]) -> str:
    entry = params["entry_id"]
    if not ENTRY_ID.match(entry):
        raise ActionError(f"bad dead-letter entry id {entry!r}")
    return entry


def requeue(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    tid = check_task_id(params["task_id"])
    got = d.admin.requeue_dead(tid, _entry(params))
    again = " The task is active again." if got.reopened else ""
    return {
        "index": got.index,
        "entry": got.new_entry,
        "reopened": got.reopened,
        "message": f"Subtask {got.index} requeued.{again}",
    }


def delete(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    tid = check_task_id(params["task_id"])
    entry = _entry(params)
    if not d.admin.delete_dead(tid, entry):
        raise LookupError(f"dead letter {entry} of task {tid} not found")
    return {"deleted": entry, "message": "Dead letter deleted."}


def drain(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    wid = check_worker_id(params["worker_id"])
    if d.client.redis.zscore(d.client.keys.workers, wid) is None:
        raise LookupError(f"worker {wid} not found")
    d.client.drain_worker(wid)
    return {"draining": wid, "message": f"Worker {wid} will leave and exit."}


def _queue(d: Dashboard, params: dict[str, str]) -> str:
    name = check_task_id(params["queue"])
    if not d.queues.is_queue(name):
        raise LookupError(f"queue {name}")
    return name


def requeue_job(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    got = d.admin.requeue_job(_queue(d, params), _entry(params))
    return {"job": got.job, "entry": got.new_entry, "message": f"Job {got.job} requeued."}


def delete_job(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    name, entry = _queue(d, params), _entry(params)
    if not d.admin.delete_dead(name, entry):
        raise LookupError(f"dead letter {entry} of queue {name} not found")
    return {"deleted": entry, "message": "Dead letter deleted."}


def _planned(d: Dashboard, plan: Plan[T]) -> T:
    return run(d.client.redis, d.client.scripts, plan)


def pause(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    name = _queue(d, params)
    changed = _planned(d, plan_pause(d.client.keys, name, True))
    said = "paused: its members read no new job" if changed else "was paused already"
    return {"paused": True, "changed": changed, "message": f"Queue {name} {said}."}


def resume(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    name = _queue(d, params)
    changed = _planned(d, plan_pause(d.client.keys, name, False))
    said = "resumed" if changed else "was not paused"
    return {"paused": False, "changed": changed, "message": f"Queue {name} {said}."}


def empty(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    name = _queue(d, params)
    n = _planned(d, plan_empty(d.client.keys, name))
    return {"cancelled": n, "message": f"{n} job(s) of the backlog of {name} cancelled."}


def requeue_all(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    name = _queue(d, params)
    n = _planned(d, plan_requeue_dead(d.client.keys, name))
    gone = d.queues.dead_without_letter(name)
    said = f"{n} dead job(s) of {name} requeued."
    if gone:
        said += (
            f" {gone} job(s) counted dead have no dead letter kept (the newest are kept; "
            "deleted ones are gone): nothing can requeue them."
        )
    return {"requeued": n, "dead_without_letter": gone, "message": said}


def delete_all(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    name = _queue(d, params)
    n = _planned(d, plan_delete_dead(d.client.keys, name))
    return {"deleted": n, "message": f"{n} dead letter(s) of {name} deleted."}


def cancel_one(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    return job_actions.cancel(d, _queue(d, params), params["job_id"])


def requeue_one(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    return job_actions.requeue(d, _queue(d, params), params["job_id"])


def delete_one(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    return job_actions.delete(d, _queue(d, params), params["job_id"])


def run_now(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    name, job = _queue(d, params), params["job_id"]
    if not _planned(d, plan_run_now(d.client.keys, name, job)):
        raise ActionError(f"job {job} of {name} is not scheduled (it runs, or has run)")
    return {"job": job, "message": f"Job {job} is on the queue's stream: it runs next."}


def settings(d: Dashboard, params: dict[str, str], form: dict[str, Any]) -> dict[str, Any]:
    """The queue's live settings from its form (``Queue.configure``); those not in the
    form stay as they are ("" for one that may be no limit: no limit)."""
    name = _queue(d, params)
    given = {k: _setting(form, k) for k in LIVE if k in form}
    if not given:
        raise ActionError("no setting given: " + ", ".join(LIVE))
    now = _planned(d, plan_configure(d.client.keys, name, given))
    return {
        "settings": {k: getattr(now, k) for k in LIVE},
        "message": f"Settings of {name} saved: its workers start their next jobs with them.",
    }


QUEUE_ACTIONS: dict[str, Action] = {"requeue": requeue_job, "delete": delete_job}
WHOLE_QUEUE_ACTIONS: dict[str, Action] = {
    "pause": pause,
    "resume": resume,
    "empty": empty,
    "settings": settings,
}
DEAD_ACTIONS: dict[str, Action] = {"requeue-all": requeue_all, "delete-all": delete_all}
JOB_ACTIONS: dict[str, Action] = {
    "run": run_now,
    "cancel": cancel_one,
    "requeue": requeue_one,
    "delete": delete_one,
}

ACTIONS: dict[str, Action] = {
    "cancel": cancel,
    "priority": priority,
    "resize": resize,
    "requeue": requeue,
    "delete": delete,
    "drain": drain,
}


class BodyTooLarge(ActionError):
    pass


async def read_body(request: Request) -> bytes:
    """The request body, read only up to ``MAX_BODY``: a bigger one is refused as it
    streams in (its declared length is refused before anything is read, by the gate)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BodyTooLarge("request body too large")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_form(request: Request) -> dict[str, Any]:
    """A JSON object or an urlencoded form (no multipart: nothing here uploads files)."""
    body = await read_body(request)
    if not body:
        return {}
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            data = json.loads(body)
        except ValueError:
            raise ActionError("body is not valid JSON") from None
        if not isinstance(data, dict):
            raise ActionError("JSON body must be an object")
        return data
    return dict(parse_qsl(body.decode(errors="replace"), keep_blank_values=True))


def _error(request: Request, status: int, message: str) -> Response:
    return json_response(request, {"ok": False, "error": message}, status)


async def run_action(request: Request) -> Response:
    d = dash_of(request)
    api = request.url.path.startswith("/api/")
    if not same_origin(request):
        return _error(request, 403, "cross-origin request refused")
    try:
        form = await read_form(request)
    except ActionError as exc:
        return _error(request, 413 if isinstance(exc, BodyTooLarge) else 400, str(exc))
    if not d.guard.bearer_ok(request):  # authenticated by cookie, or no token: CSRF check
        submitted = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
        if not d.guard.csrf_ok(request, str(submitted) if submitted else None):
            return _error(request, 403, "CSRF token missing or invalid; reload the page")
    name = request.path_params.get("action") or request.path_params["bulk"]
    action = _table(request.path_params).get(name)
    if action is None:
        return _error(request, 404, f"no action {name!r}")
    params = {k: str(v) for k, v in request.path_params.items()}
    try:
        result = await run_in_threadpool(action, d, params, form)
    except (TaskNotFound, LookupError) as exc:
        return _error(request, 404, f"not found: {exc}")
    except job_actions.Conflict as exc:
        return _error(request, 409, str(exc))
    except (ActionError, AdminError, ValueError) as exc:
        return _error(request, 400, str(exc))
    if api:
        return json_response(request, {"ok": True, **result})
    return RedirectResponse(_back(request, form), status_code=303)


def _table(params: dict[str, Any]) -> dict[str, Action]:
    """The actions of the address matched: by the parameters its route has."""
    if "queue" not in params:
        return ACTIONS
    if "entry_id" in params:
        return QUEUE_ACTIONS
    if "job_id" in params:
        return JOB_ACTIONS
    return DEAD_ACTIONS if "bulk" in params else WHOLE_QUEUE_ACTIONS


def _back(request: Request, form: dict[str, Any]) -> str:
    """Where a plain form post returns to: a local path only (never another site)."""
    return local_path(str(form.get("next") or ""))
