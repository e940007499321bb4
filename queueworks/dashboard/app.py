"""The dashboard application: routes, authentication middleware, error pages, lifespan."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any
from urllib.parse import quote

import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from queueworks.client.sync import Client
from queueworks.dashboard import actions, api, pages
from queueworks.dashboard.actions import MAX_BODY
from queueworks.dashboard.reader import BadQuery
from queueworks.dashboard.security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SESSION_COOKIE,
    host_allowed,
    local_path,
)
from queueworks.dashboard.state import Dashboard, DashboardConfig, dash_of
from queueworks.dashboard.templating import json_response, render, templates
from queueworks.errors import TaskNotFound
from queueworks.logs import get_logger
from queueworks.transport.connection import connect

PUBLIC = ("/static/", "/login", "/healthz")
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


def _machine(request: Request) -> bool:
    """Requests that want JSON / text answers rather than pages."""
    path = request.url.path
    return path.startswith("/api/") or path == "/metrics" or request.method != "GET"


class Gate(BaseHTTPMiddleware):
    """Authentication (token) for everything but the login page and static assets; a CSRF
    cookie for every browser; security headers on every answer."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        d = dash_of(request)
        guard = d.guard
        path = request.url.path
        if not host_allowed(request.headers.get("host", ""), d.config.host, d.config.allowed_hosts):
            return PlainTextResponse("Host not allowed", status_code=400)
        if _declared_length(request) > MAX_BODY:  # refused before a byte of it is read
            return PlainTextResponse("request body too large", status_code=413)
        if not path.startswith(PUBLIC) and not guard.authenticated(request):
            if _machine(request):
                return JSONResponse(
                    {"ok": False, "error": "authentication required"},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="queueworks"'},
                )
            nxt = quote(path + (f"?{request.url.query}" if request.url.query else ""))
            return RedirectResponse(f"/login?next={nxt}", status_code=303)
        cookie = request.cookies.get(CSRF_COOKIE)
        fresh = None if guard.csrf_valid(cookie) else guard.new_csrf()
        request.state.csrf = fresh or cookie
        response = await call_next(request)
        if fresh is not None:
            response.set_cookie(CSRF_COOKIE, fresh, httponly=True, samesite="strict", path="/")
        h = response.headers
        h.setdefault("X-Content-Type-Options", "nosniff")
        h.setdefault("X-Frame-Options", "DENY")
        h.setdefault("Referrer-Policy", "same-origin")
        h.setdefault("Content-Security-Policy", CSP)
        if not path.startswith("/static/"):
            h.setdefault("Cache-Control", "no-store")
        return response


def _declared_length(request: Request) -> int:
    try:
        return int(request.headers.get("content-length", "0"))
    except ValueError:
        return MAX_BODY + 1  # a length that is no number: refuse it


async def login(request: Request) -> Response:
    d = dash_of(request)
    nxt = local_path(request.query_params.get("next", "/"))
    if d.config.token is None:
        return RedirectResponse(nxt, status_code=303)
    error = ""
    if request.method == "POST":
        form = await actions.read_form(request)
        if not d.guard.csrf_ok(request, form.get(CSRF_FIELD)):
            error = "The form expired; try again."
        elif d.guard.token_ok(str(form.get("token", ""))):
            resp = RedirectResponse(nxt, status_code=303)
            resp.set_cookie(
                SESSION_COOKIE, d.guard.session_value(), httponly=True, samesite="strict"
            )
            return resp
        else:
            error = "Wrong token."
    ctx = d.context(request, "login", next=nxt, error=error)
    return render(request, "login.html", ctx, status=401 if error else 200)


async def logout(request: Request) -> Response:
    d = dash_of(request)
    form = await actions.read_form(request)
    if not d.guard.csrf_ok(request, form.get(CSRF_FIELD)):
        return PlainTextResponse("CSRF token missing or invalid", status_code=403)
    resp = RedirectResponse("/login", status_code=303)
    resp.delete_cookie(SESSION_COOKIE)
    return resp


def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


def _problem(request: Request, status: int, message: str) -> Response:
    if _machine(request):
        return json_response(request, {"ok": False, "error": message}, status)
    d = dash_of(request)
    return render(request, "error.html", d.context(request, "", message=message), status)


async def not_found(request: Request, exc: Exception) -> Response:
    what = request.url.path if isinstance(exc, HTTPException) else str(exc)
    return _problem(request, 404, f"not found: {what}")


async def bad_request(request: Request, exc: Exception) -> Response:
    return _problem(request, 400, str(exc))


async def too_large(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(str(exc), status_code=413)


async def redis_down(request: Request, exc: Exception) -> Response:
    d = dash_of(request)
    get_logger().warning("redis_unavailable", error=type(exc).__name__, path=request.url.path)
    return _problem(request, 503, f"Redis at {d.redis_shown} is unavailable ({type(exc).__name__})")


def routes() -> list[Any]:
    action_paths = [
        "/tasks/{task_id}/{action:str}",
        "/tasks/{task_id}/dead/{entry_id}/{action:str}",
        "/workers/{worker_id}/{action:str}",
        "/queues/{queue}/dead/{entry_id}/{action:str}",
        "/queues/{queue}/dead/{bulk:str}",
        "/queues/{queue}/jobs/{job_id}/{action:str}",
        "/queues/{queue}/{action:str}",
    ]
    static = resources.files("queueworks.dashboard").joinpath("static")
    return [
        Route("/", pages.overview),
        Route("/tasks", pages.tasks_page),
        Route("/tasks/{task_id}", pages.task_page),
        Route("/queues", pages.queues_page),
        Route("/queues/{name}", pages.queue_page),
        Route("/queues/{name}/jobs/{id}", pages.job_page),
        Route("/search", pages.search),
        Route("/workers", pages.workers_page),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/healthz", healthz),
        Route("/metrics", api.metrics),
        Route("/api/overview", api.overview),
        Route("/api/tasks", api.tasks),
        Route("/api/tasks/{task_id}", api.task),
        Route("/api/queues", api.queues),
        Route("/api/queues/{name}", api.queue),
        Route("/api/queues/{name}/schedules", api.queue_schedules),
        Route("/api/queues/{name}/jobs", api.queue_jobs),
        Route("/api/queues/{name}/jobs/{id}", api.queue_job),
        Route("/api/workers", api.workers),
        Route("/api/events", api.events),
        Route("/api/autoscale", api.autoscale),
        Route("/api/history", api.throughput_history),
        *(Route(p, actions.run_action, methods=["POST"]) for p in action_paths),
        *(Route("/api" + p, actions.run_action, methods=["POST"]) for p in action_paths),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]


async def _sample(dash: Dashboard) -> None:
    """Throughput samples, every ``sample_interval`` s, for as long as the app runs."""
    while True:
        with contextlib.suppress(redis.RedisError, OSError):
            await run_in_threadpool(dash.throughput.sample, dash.client.redis, dash.client.keys)
        await asyncio.sleep(dash.config.sample_interval)


def create_app(config: DashboardConfig, client: Client | None = None) -> Starlette:
    """The ASGI app; ``client`` defaults to one built from ``config`` (closed on shutdown)."""
    own = client is None
    if client is None:
        client = Client(
            connect(config.redis_url, ssl_ca_certs=config.ssl_ca_certs, socket_timeout=5.0),
            prefix=config.prefix,
            allow_eviction=True,  # it only warns (queueworks dashboard): actions still run
        )
    dash = Dashboard(config, client)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sampler = asyncio.create_task(_sample(dash))
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            if own:
                dash.client.close()

    app = Starlette(
        routes=routes(),
        middleware=[Middleware(Gate)],
        exception_handlers={
            404: not_found,
            TaskNotFound: not_found,
            BadQuery: bad_request,
            actions.BodyTooLarge: too_large,
            ValueError: bad_request,
            redis.ConnectionError: redis_down,
            redis.TimeoutError: redis_down,
        },
        lifespan=lifespan,
    )
    app.state.dash = dash
    app.state.templates = templates()
    return app
