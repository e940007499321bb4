"""Jinja2 templates of the dashboard and the filters they use."""

from __future__ import annotations

import json
import time
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.templating import Jinja2Templates


def age(ts: float | None, now: float | None = None) -> str:
    """Seconds since ``ts`` as "0.4s", "12s", "5m 3s", "2h 10m", "3d 4h"."""
    if ts is None:
        return "-"
    s = max(0.0, (now or time.time()) - ts)
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m {int(s % 60)}s"
    if s < 86400:
        return f"{int(s // 3600)}h {int(s % 3600 // 60)}m"
    return f"{int(s // 86400)}d {int(s % 86400 // 3600)}h"


def clock(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}s" if value < 100 else age(time.time() - value)


def templates() -> Jinja2Templates:
    env = Environment(
        loader=PackageLoader("queueworks.dashboard", "templates"),
        autoescape=select_autoescape(default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=age, clock=clock, seconds=seconds)
    return Jinja2Templates(env=env)


def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    """A page, rendered to text and scrubbed of the Redis password before it leaves."""
    tpl: Jinja2Templates = request.app.state.templates
    body = tpl.get_template(name).render(context)
    return HTMLResponse(request.app.state.dash.scrub(body), status_code=status)


def json_response(request: Request, data: Any, status: int = 200) -> Response:
    """JSON, scrubbed of the Redis password like every page."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return Response(
        request.app.state.dash.scrub(body), status_code=status, media_type="application/json"
    )
