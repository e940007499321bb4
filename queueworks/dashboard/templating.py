"""Jinja2 templates of the dashboard and the filters they use.

Every template autoescapes, and nothing in them is marked safe: a stored value (a name, a
traceback, a result) is text wherever it lands, in an element or in a (double-quoted)
attribute. JSON is shown as text (``json_text``), never as Jinja's ``tojson`` (its output
is marked safe and keeps ``"``); a stored id or name in an address is one quoted path
segment (``segment``); query strings are built by ``with_query``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, pass_context, select_autoescape
from jinja2.runtime import Context
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.templating import Jinja2Templates

from queueworks.dashboard.views import QueueDetail
from queueworks.protocol.jobrecords import DONE_PAYLOAD_KEPT
from queueworks.queue.queue_settings import LIVE, SETTINGS


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
    """A time as UTC, to the millisecond, labelled: "2026-12-07 02:33:01.123 UTC"."""
    if ts is None:
        return "-"
    whole, ms = divmod(round(ts * 1000), 1000)
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(whole))}.{ms:03d} UTC"


def took(start: float | None, end: float | None) -> str:
    """How long from ``start`` to ``end`` (a job's run): "85 ms", "2.41 s", "5m 3s"."""
    if start is None or end is None:
        return "-"
    s = max(0.0, end - start)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.2f} s"
    return age(start, end)


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}s" if value < 100 else age(time.time() - value)


def segment(value: Any) -> str:
    """``value`` as one path segment of an address: everything but letters, digits and
    ``_.-~`` quoted, so a stored id cannot add a segment, a query or a scheme."""
    return quote(str(value), safe="")


def json_text(value: Any) -> str:
    """A stored JSON value as plain text (escaped like any other text where it is shown)."""
    return json.dumps(value, ensure_ascii=False)


@pass_context
def with_query(ctx: Context, **changes: Any) -> str:
    """This page's address with its query parameters, ``changes`` applied (``None``
    removes one): a filter or pager link keeps every other parameter."""
    request: Request = ctx["request"]
    kept = [(k, v) for k, v in request.query_params.multi_items() if k not in changes]
    kept += [(k, str(v)) for k, v in changes.items() if v is not None]
    path = quote(request.url.path)
    return f"{path}?{urlencode(kept)}" if kept else path


def duration(seconds: float) -> str:
    """A bound of the latency histogram: "0.5 ms", "250 ms", "1 s"."""
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def quantile_text(detail: QueueDetail, q: float) -> str:
    """The ``q`` quantile of a queue's enqueue -> start latency as the page shows it: "≤ "
    the bucket's bound, or "> " the last finite bound when it falls in the +Inf bucket;
    "-" before any job started."""
    if not detail.latency_count:
        return "-"
    bound = detail.latency_quantile(q)
    if bound is not None:
        return f"≤ {duration(bound)}"
    finite = [b.le for b in detail.latency if b.le is not None]
    return f"> {duration(max(finite, default=0.0))}"


def templates() -> Jinja2Templates:
    env = Environment(
        loader=PackageLoader("queueworks.dashboard", "templates"),
        autoescape=select_autoescape(default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        age=age,
        clock=clock,
        seconds=seconds,
        segment=segment,
        json_text=json_text,
        duration=duration,
    )
    env.globals.update(with_query=with_query, quantile_text=quantile_text, took=took)
    env.globals.update(live_settings=[SETTINGS[name] for name in LIVE])
    env.globals.update(payload_kept=DONE_PAYLOAD_KEPT)
    return Jinja2Templates(env=env)


def render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    """A page, rendered to text and scrubbed of the Redis password before it leaves; to a
    live update (``X-Live``), only its live blocks that changed (``live_update``)."""
    tpl: Jinja2Templates = request.app.state.templates
    body = request.app.state.dash.scrub(tpl.get_template(name).render(context))
    have = request.headers.get(LIVE_HEADER)
    if have is not None and status == 200:
        return json_response(request, live_update(body, have))
    return HTMLResponse(body, status_code=status)


LIVE_HEADER = "X-Live"  # a live update asks with the hashes of the blocks it shows
_LIVE = re.compile(r'<div data-live="([A-Za-z0-9_-]{1,40})">')
_DIV = re.compile(r"<div\b|</div>")  # stored values are escaped: no "<div" comes from them
_HAVE = re.compile(r"([A-Za-z0-9_-]{1,40})=([0-9a-f]{16})")


def live_blocks(body: str) -> dict[str, str]:
    """The inner HTML of each ``<div data-live="name">`` of a rendered page, by name."""
    out: dict[str, str] = {}
    for start in _LIVE.finditer(body):
        depth = 1
        for tag in _DIV.finditer(body, start.end()):
            depth += -1 if tag.group() == "</div>" else 1
            if depth == 0:
                out[start.group(1)] = body[start.end() : tag.start()]
                break
    return out


def live_update(body: str, have: str) -> dict[str, Any]:
    """What a live update of a page sends: the hash of each of its live blocks, and the
    HTML of those whose hash is not the one the browser said it has (``have``:
    ``name=hash`` pairs)."""
    known = dict(_HAVE.findall(have[:4000]))
    hashes, changed = {}, {}
    for block, html in live_blocks(body).items():
        digest = hashlib.blake2b(html.encode(), digest_size=8).hexdigest()
        hashes[block] = digest
        if known.get(block) != digest:
            changed[block] = html
    return {"hashes": hashes, "blocks": changed}


def json_response(request: Request, data: Any, status: int = 200) -> Response:
    """JSON, scrubbed of the Redis password like every page."""
    body = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return Response(
        request.app.state.dash.scrub(body), status_code=status, media_type="application/json"
    )
