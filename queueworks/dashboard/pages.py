"""The HTML pages (server-rendered; ``static/app.js`` refreshes their ``data-live`` parts)."""

from __future__ import annotations

import math
import re
import time
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from queueworks.dashboard import history
from queueworks.dashboard.arguments import job_arguments
from queueworks.dashboard.reader import BadQuery, TaskRef, dead_before, task_counts
from queueworks.dashboard.state import Dashboard, dash_of
from queueworks.dashboard.templating import clock, render, segment
from queueworks.dashboard.views import TaskSummary
from queueworks.errors import TaskNotFound
from queueworks.protocol.keys import check_task_id
from queueworks.protocol.models import ACTIVE_STATES, JobState, TaskState
from queueworks.protocol.validate import NAME_PATTERN
from queueworks.queue.job_lists import LISTED
from queueworks.queue.job_lists import MAX_LIMIT as MAX_JOBS
from queueworks.transport.lost_workers import WINDOW as LOST_WINDOW

T = TypeVar("T", TaskRef, TaskSummary)
STATE_FILTERS = ("all", "active", *(s.value for s in TaskState))
JOBS = 20  # a queue page's jobs of one state, a page (unless ``jobs_limit`` says)
PAGE_SIZES = (20, 50, 100, 500)  # the page sizes a queue page offers
NAMES_SHOWN = 100  # tasks a search by name lists
_NAME = re.compile(NAME_PATTERN + r"\Z")


def chart(series: list[tuple[float, float]], width: int = 600, height: int = 90) -> dict[str, Any]:
    """SVG bars for the throughput series (no script, no library)."""
    peak = max((v for _, v in series), default=0.0)
    top = _nice(peak)
    n = max(1, len(series))
    slot = width / n
    bars = []
    for i, (t, v) in enumerate(series):
        h = 0.0 if top == 0 else (v / top) * (height - 4)
        bars.append(
            {
                "x": round(i * slot + 1, 1),
                "y": round(height - h, 1),
                "w": round(max(1.0, slot - 2), 1),
                "h": round(h, 1),
                "title": f"{clock(t)[11:]}: {v:.1f}/s",
            }
        )
    return {"bars": bars, "width": width, "height": height, "top": top, "last": series[-1][1]}


def minute_bars(
    minutes: list[history.Minute], width: int = 600, height: int = 90
) -> dict[str, Any]:
    """SVG bars of settled (and, over them, dead) per minute; a minute no dashboard
    watched has no bar."""
    top = _nice(float(max((m.settled or 0 for m in minutes), default=0)))
    slot = width / max(1, len(minutes))
    bars = []
    for i, m in enumerate(minutes):
        if m.settled is None:
            continue
        scale = 0.0 if top == 0 else (height - 4) / top
        h, dh = m.settled * scale, (m.dead or 0) * scale
        bars.append(
            {
                "x": round(i * slot + 1, 1),
                "w": round(max(1.0, slot - 2), 1),
                "y": round(height - h, 1),
                "h": round(h, 1),
                "dy": round(height - dh, 1),
                "dh": round(dh, 1),
                "title": f"{clock(m.at)[11:16]} UTC: {m.settled} settled, {m.dead} dead",
            }
        )
    known = [m for m in minutes if m.settled is not None]
    return {
        "bars": bars,
        "width": width,
        "height": height,
        "top": top,
        "settled": sum(m.settled or 0 for m in known),
        "dead": sum(m.dead or 0 for m in known),
        "known": len(known),
        "count": len(minutes),
    }


def _nice(value: float) -> float:
    if value <= 0:
        return 0.0
    exp = 10 ** math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if value <= m * exp:
            return float(m * exp)
    return float(10 * exp)  # pragma: no cover


def tasks_only(d: Dashboard, tasks: list[T], queues: list[str] | None = None) -> list[T]:
    """``tasks`` without the queues (a queue is a task, shown in its own section)."""
    hidden = set(d.queues.names() if queues is None else queues)
    return [t for t in tasks if t.id not in hidden] if hidden else tasks


def overview(request: Request) -> Response:
    d = dash_of(request)
    names = d.queues.names()
    index = tasks_only(d, d.reader.index(), names)
    workers = d.reader.workers()
    active = [t.id for t in index if not t.finished][:10]
    ctx = d.context(
        request,
        "overview",
        tasks_by_state=task_counts(index),
        tasks_total=len(index),
        workers_by_state=d.reader.worker_counts(workers, d.reader.lost_workers()),
        workers_total=len(workers),
        running=d.reader.summaries(active),
        queues=d.queues.summaries(names),
        leader=d.reader.leader(),
        chart=chart(d.throughput.series()),
        minutes=minute_bars(history.read(d.client.redis, d.client.keys, time.time())),
        window_min=int(d.throughput.window // 60),
        events=d.reader.events(25),
    )
    return render(request, "overview.html", ctx)


def filter_tasks(tasks: list[T], state: str) -> list[T]:
    if state == "active":
        return [t for t in tasks if t.state in ACTIVE_STATES]
    if state == "all":
        return tasks
    return [t for t in tasks if t.state.value == state]


def tasks_page(request: Request) -> Response:
    d = dash_of(request)
    state = request.query_params.get("state", "all")
    if state not in STATE_FILTERS:
        state = "all"
    page = _int_param(request.query_params.get("page"), 1)
    index = tasks_only(d, d.reader.index())
    shown = filter_tasks(index, state)
    size = d.config.page_size
    pages = max(1, math.ceil(len(shown) / size))
    page = min(max(1, page), pages)
    counts = task_counts(index) | {"all": len(index), "active": len(filter_tasks(index, "active"))}
    ctx = d.context(
        request,
        "tasks",
        tasks=d.reader.summaries([t.id for t in shown[(page - 1) * size : page * size]]),
        matching=len(shown),
        state_filter=state,
        filters=STATE_FILTERS,
        counts=counts,
        page=page,
        pages=pages,
    )
    return render(request, "tasks.html", ctx)


def task_page(request: Request) -> Response:
    d = dash_of(request)
    task_id = request.path_params["task_id"]
    if d.queues.is_queue(task_id):
        return RedirectResponse(f"/queues/{task_id}", status_code=303)
    detail = d.reader.detail(task_id, dead_before(request.query_params.get("dead_before")))
    events = d.reader.events(15, task=detail.task.id)
    ctx = d.context(request, "tasks", d=detail, t=detail.task, events=events)
    return render(request, "task.html", ctx)


def queues_page(request: Request) -> Response:
    d = dash_of(request)
    return render(request, "queues.html", d.context(request, "queues", queues=d.queues.queues()))


def queue_page(request: Request) -> Response:
    d = dash_of(request)
    name = request.path_params["name"]
    if not d.queues.is_queue(check_task_id(name)):
        d.reader.task_summary(name)  # no such task either: 404
        return RedirectResponse(f"/tasks/{name}", status_code=303)
    detail = d.queues.detail(name, dead_before(request.query_params.get("dead_before")))
    events = d.reader.events(15, task=name)
    counts = detail.jobs_by_state
    where = next((s for s, n in counts.items() if n), JobState.QUEUED.value)  # the jobs' tab
    state = request.query_params.get("jobs", where)
    if state not in LISTED:
        raise BadQuery(f"jobs must be one of {', '.join(LISTED)}, got {state[:40]!r}")
    limit = _query_int(request, "jobs_limit", JOBS, 1, MAX_JOBS)
    offset = _query_int(request, "jobs_offset", 0, 0, 10**9)
    wanted = request.query_params.get("jobs_q", "").strip()
    searched: tuple[int, bool] | None = None
    if wanted:
        jobs, seen, complete = d.queues.find_jobs(name, state, wanted, limit, offset)
        searched = (seen, complete)
    else:
        jobs = d.queues.jobs(name, state, limit, offset)
    ctx = d.context(
        request,
        "queues",
        d=detail,
        q=detail.queue,
        events=events,
        jobs=jobs,
        states=LISTED,
        wanted=wanted,
        searched=searched,
        page_sizes=PAGE_SIZES,
    )
    return render(request, "queue.html", ctx)


def job_page(request: Request) -> Response:
    d = dash_of(request)
    name = request.path_params["name"]
    job = d.queues.job(name, request.path_params["id"])
    q = d.queues.summary(name)
    lost = job.state == JobState.RUNNING and d.queues.worker_lost(job.worker)
    args = job_arguments(job.payload, job.handler, d.config.allow)  # a typed job's, by name
    trace_url = d.config.trace_url
    ctx = d.context(request, "queues", j=job, q=q, args=args, trace_url=trace_url, worker_lost=lost)
    return render(request, "job.html", ctx)


def search(request: Request) -> Response:
    """``/search?q=``: the page of the task, queue or job of that id (a job's: of the queue
    that has it; ``QUEUE/JOB`` names both, and the queue must have that job); else the
    queues and tasks whose name has it (the page of the one, or a list); 404 when nothing
    has it."""
    d = dash_of(request)
    wanted = request.query_params.get("q", "").strip()
    queue, _, job = wanted.rpartition("/")
    if queue and _NAME.match(queue) and d.queues.is_queue(queue):
        d.queues.job(queue, job)  # TaskNotFound (404) where the job's page would be one
        return RedirectResponse(f"/queues/{segment(queue)}/jobs/{segment(job)}", status_code=303)
    if _NAME.match(wanted) and d.client.redis.exists(d.client.keys.task(wanted).record):
        return RedirectResponse(f"/tasks/{segment(wanted)}", status_code=303)
    found = d.queues.find(wanted)
    if found is not None:
        return RedirectResponse(f"/queues/{segment(found)}/jobs/{segment(wanted)}", status_code=303)
    queues, tasks = _named(d, wanted) if wanted else ([], [])
    if len(queues) + len(tasks) == 1:
        where = f"/queues/{segment(queues[0])}" if queues else f"/tasks/{segment(tasks[0][0])}"
        return RedirectResponse(where, status_code=303)
    if not queues and not tasks:
        raise TaskNotFound(f"no task, queue or job has the id or name {wanted[:100]!r}")
    ctx = d.context(request, "", wanted=wanted, queues=queues, tasks=tasks[:NAMES_SHOWN])
    return render(request, "search.html", ctx | {"tasks_found": len(tasks)})


def _named(d: Dashboard, wanted: str) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The queues and the tasks (id, name, state) whose name has ``wanted`` (case
    aside): one pipeline of the tasks' names."""
    low = wanted.lower()
    names = d.queues.names()
    queues = [n for n in names if low in n.lower()]
    index = tasks_only(d, d.reader.index(), names)
    pipe = d.client.redis.pipeline(transaction=False)
    for t in index:
        pipe.hget(d.client.keys.task(t.id).record, "name")
    tasks = []
    for t, raw in zip(index, pipe.execute(raise_on_error=False), strict=True):
        name = raw.decode(errors="replace") if isinstance(raw, bytes) else ""
        if low in name.lower():
            tasks.append((t.id, name, t.state.value))
    return queues, tasks


def workers_page(request: Request) -> Response:
    d = dash_of(request)
    workers = d.reader.workers()
    lost = d.reader.lost_workers()
    ctx = d.context(
        request,
        "workers",
        workers=workers,
        pools=d.reader.pools(),
        lost=lost,
        lost_minutes=int(LOST_WINDOW // 60),
        counts=d.reader.worker_counts(workers, lost),
    )
    return render(request, "workers.html", ctx)


def _query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    """Query parameter ``name``, an integer from ``low`` to ``high``: ``BadQuery`` (400,
    the page says why) for anything else, never a silent default."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadQuery(f"{name} must be an integer, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise BadQuery(f"{name} must be from {low} to {high}, got {value}")
    return value


def _int_param(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw is not None else default
    except ValueError:
        return default
