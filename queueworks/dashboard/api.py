"""The JSON API (read side): ``/api/overview``, ``/api/tasks``, ``/api/tasks/{id}``,
``/api/queues``, ``/api/queues/{name}``, ``/api/queues/{name}/jobs``,
``/api/queues/{name}/jobs/{id}``, ``/api/workers``, ``/api/events``, ``/api/autoscale``,
``/api/history``; and
``/metrics``.
Documented in ``docs/dashboard.md``. Queues are listed apart, not among the tasks."""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from queueworks.dashboard import history
from queueworks.dashboard.pages import STATE_FILTERS, filter_tasks, tasks_only
from queueworks.dashboard.reader import BadQuery, dead_before, task_counts
from queueworks.dashboard.state import dash_of
from queueworks.dashboard.templating import json_response
from queueworks.dashboard.views import (
    Overview,
    QueueDetail,
    QueueSummary,
    TaskSummary,
    WorkerView,
)
from queueworks.protocol.models import JobState
from queueworks.protocol.wanted import parse_selector
from queueworks.protocol.wanted import read as read_wanted
from queueworks.queue.job_lists import MAX_LIMIT as MAX_JOBS

MAX_LIMIT = 10_000
JOBS_SHOWN = 20  # a page of a queue's jobs, unless ``limit`` says otherwise
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadQuery(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise BadQuery(f"{name} must be between {low} and {high}, got {value}")
    return value


def task_json(t: TaskSummary) -> dict[str, Any]:
    return t.model_dump(mode="json") | {"progress": round(t.progress, 4)}


def worker_json(w: WorkerView) -> dict[str, Any]:
    return w.model_dump(mode="json") | {"status": w.status}


def tasks(request: Request) -> Response:
    d = dash_of(request)
    state = request.query_params.get("state", "all")
    if state not in STATE_FILTERS:
        raise BadQuery(f"state must be one of {', '.join(STATE_FILTERS)}, got {state!r}")
    limit = _param(request, "limit", 1000, 1, MAX_LIMIT)
    offset = _param(request, "offset", 0, 0, 10**9)
    shown = filter_tasks(tasks_only(d, d.reader.tasks()), state)  # one pass: no index + rows
    rows = shown[offset : offset + limit]
    return json_response(
        request,
        {
            "count": len(shown),
            "offset": offset,
            "limit": limit,
            "tasks": [task_json(t) for t in rows],
        },
    )


def task(request: Request) -> Response:
    d = dash_of(request)
    before = dead_before(request.query_params.get("dead_before"))
    detail = d.reader.detail(request.path_params["task_id"], before)
    body = detail.model_dump(mode="json")
    body["task"] = task_json(detail.task)
    body["backlog_total"] = detail.backlog_total
    return json_response(request, body)


def queue_json(q: QueueSummary) -> dict[str, Any]:
    return q.model_dump(mode="json")


def queues(request: Request) -> Response:
    d = dash_of(request)
    rows = d.queues.queues()
    return json_response(request, {"count": len(rows), "queues": [queue_json(q) for q in rows]})


def queue(request: Request) -> Response:
    d = dash_of(request)
    before = dead_before(request.query_params.get("dead_before"))
    detail: QueueDetail = d.queues.detail(request.path_params["name"], before)
    body = detail.model_dump(mode="json")
    body["latency_p50"] = detail.latency_quantile(0.5)
    body["latency_p99"] = detail.latency_quantile(0.99)
    return json_response(request, body)


def queue_schedules(request: Request) -> Response:
    found = dash_of(request).queues.schedules(request.path_params["name"])
    body = {"count": len(found), "schedules": [s.model_dump(mode="json") for s in found]}
    return json_response(request, body)


def queue_job(request: Request) -> Response:
    """One job in full (``job.detail()``); 404 for a queue or job that is none."""
    d = dash_of(request)
    found = d.queues.job(request.path_params["name"], request.path_params["id"])
    lost = found.state == JobState.RUNNING and d.queues.worker_lost(found.worker)
    return json_response(request, found.model_dump(mode="json") | {"worker_lost": lost})


def queue_jobs(request: Request) -> Response:
    """A page of a queue's jobs in one state (``Queue.jobs``); with ``q``, those whose id
    starts with it or whose handler or error has it (``plan_find_jobs``)."""
    d = dash_of(request)
    state = request.query_params.get("state", "queued")
    limit = _param(request, "limit", JOBS_SHOWN, 1, MAX_JOBS)
    offset = _param(request, "offset", 0, 0, 10**9)
    wanted = request.query_params.get("q")
    name = request.path_params["name"]
    if wanted is None:
        page = d.queues.jobs(name, state, limit, offset)
        return json_response(request, page.model_dump(mode="json"))
    found, searched, complete = d.queues.find_jobs(name, state, wanted, limit, offset)
    body = found.model_dump(mode="json") | {"q": wanted, "searched": searched}
    return json_response(request, body | {"complete": complete})


def workers(request: Request) -> Response:
    d = dash_of(request)
    rows = d.reader.workers()
    lost = d.reader.lost_workers()
    return json_response(
        request,
        {
            "count": len(rows),
            "by_state": d.reader.worker_counts(rows, lost),
            "workers": [worker_json(w) for w in rows],
            "pools": [p.model_dump(mode="json") for p in d.reader.pools()],
            "lost": [w.model_dump(mode="json") for w in lost],
        },
    )


def events(request: Request) -> Response:
    d = dash_of(request)
    count = _param(request, "count", 50, 1, 1000)
    only = request.query_params.get("task") or None
    rows = d.reader.events(count, task=only)
    return json_response(request, {"events": [e.model_dump(mode="json") for e in rows]})


def overview(request: Request) -> Response:
    d = dash_of(request)
    names = d.queues.names()
    all_tasks = tasks_only(d, d.reader.index(), names)
    rows = d.reader.workers()
    body = Overview(
        tasks_by_state=task_counts(all_tasks),
        workers_by_state=d.reader.worker_counts(rows, d.reader.lost_workers()),
        tasks_total=len(all_tasks),
        workers_total=len(rows),
        leader=d.reader.leader(),
        throughput=d.throughput.series(),
        events=d.reader.events(25),
        queues=d.queues.summaries(names),
    )
    shown = minutes_json(history.read(d.client.redis, d.client.keys, time.time()))
    return json_response(request, body.model_dump(mode="json") | {"history": shown})


def minutes_json(minutes: list[history.Minute]) -> list[dict[str, Any]]:
    return [m._asdict() for m in minutes]


def throughput_history(request: Request) -> Response:
    """``/api/history?minutes=``: subtasks and jobs settled and dead per minute, the last
    ``minutes`` (60; at most a day) before this one, oldest first (``dashboard.history``)."""
    d = dash_of(request)
    count = _param(request, "minutes", 60, 1, history.KEPT)
    shown = minutes_json(history.read(d.client.redis, d.client.keys, time.time(), count))
    return json_response(request, {"minutes": shown})


def autoscale(request: Request) -> Response:
    """The workers the controller wants: ``wanted`` for ``?selector=k=v,...`` (none: the
    work that names no selector), and every selector's count (what KEDA's metrics-api
    scaler reads; ``published`` false and 0 wanted when no controller counted lately)."""
    d = dash_of(request)
    try:
        name = parse_selector([request.query_params.get("selector", "")])
    except ValueError as exc:
        raise BadQuery(str(exc)) from None
    value = read_wanted(d.reader.r, d.reader.keys)
    body: dict[str, Any] = {"selector": name, "published": value is not None}
    body["wanted"] = value.of(name) if value else 0
    body["selectors"] = value.selectors if value else {}
    body["at"], body["by"] = (value.at, value.by) if value else (None, None)
    return json_response(request, body)


def metrics(request: Request) -> Response:
    d = dash_of(request)
    return PlainTextResponse(d.scrub(d.metrics.render()), media_type=PROMETHEUS_TEXT)
