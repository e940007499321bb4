"""The dashboard's configuration and the objects one dashboard process holds."""

from __future__ import annotations

import html
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.requests import Request

from queueworks.client.admin import Admin
from queueworks.client.sync import Client
from queueworks.dashboard.metrics import Metrics
from queueworks.dashboard.queue_reader import QueueReader
from queueworks.dashboard.reader import Reader
from queueworks.dashboard.security import Guard, request_host
from queueworks.dashboard.throughput import Throughput
from queueworks.transport.connection import redact_url


class DashboardConfig(BaseModel):
    """What ``queueworks dashboard`` is started with."""

    model_config = ConfigDict(extra="forbid")

    redis_url: str
    prefix: str = Field(default="qw", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    token: str | None = Field(default=None, repr=False)
    refresh: float = Field(default=1.0, gt=0, le=3600.0)  # seconds between live updates
    sample_interval: float = Field(default=2.0, gt=0)  # throughput samples
    ssl_ca_certs: str | None = None
    page_size: int = Field(default=100, ge=1, le=1000)
    host: str = "127.0.0.1"  # the address it is bound to: loopback serves loopback names only
    allowed_hosts: tuple[str, ...] = ()  # Host names served besides the loopback ones
    trace_url: str | None = None  # a job's trace in a tracing UI: "{trace_id}" is replaced
    # module prefixes whose handlers it may import, to name a typed job's arguments
    allow: tuple[str, ...] = ()

    @field_validator("trace_url")
    @classmethod
    def _trace_url(cls, url: str | None) -> str | None:
        if url is not None and (
            "{trace_id}" not in url or not url.startswith(("http://", "https://"))
        ):
            raise ValueError(
                f"--trace-url must be an http(s) URL holding {{trace_id}}, not {url!r}"
            )
        return url

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, hosts: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(request_host(h) for h in hosts if h.strip())


@dataclass
class Dashboard:
    config: DashboardConfig
    client: Client
    reader: Reader = field(init=False)
    queues: QueueReader = field(init=False)
    admin: Admin = field(init=False)
    metrics: Metrics = field(init=False)
    throughput: Throughput = field(init=False)
    guard: Guard = field(init=False)
    secrets: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.secrets = secret_forms(self.config.redis_url)
        self.reader = Reader(self.client)
        self.queues = QueueReader(self.client)
        self.admin = Admin(self.client)
        self.metrics = Metrics(self.reader, self.queues)
        self.throughput = Throughput()
        self.guard = Guard(self.config.token)

    @property
    def redis_shown(self) -> str:
        """The Redis URL as pages show it: never with its password."""
        return redact_url(self.config.redis_url)

    def scrub(self, body: str) -> str:
        """Mask the Redis password wherever it might appear (an error text, a traceback)."""
        for secret in self.secrets:
            body = body.replace(secret, "***")
        return body

    def context(self, request: Request, nav: str, **extra: Any) -> dict[str, Any]:
        return {
            "request": request,
            "nav": nav,
            "csrf": getattr(request.state, "csrf", ""),
            "redis": self.redis_shown,
            "prefix": self.config.prefix,
            "refresh_ms": int(self.config.refresh * 1000),
            "token_set": self.config.token is not None,
            "now": time.time(),
            **extra,
        }


def dash_of(request: Request) -> Dashboard:
    d: Dashboard = request.app.state.dash
    return d


def secret_forms(url: str) -> tuple[str, ...]:
    """The password of ``url`` as it could appear in a page: raw, URL-quoted, HTML- and
    JSON-escaped. Longest first, so no form is half-replaced by a shorter one."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if not password:
        return ()
    raw = unquote(password)
    forms = {raw, password, quote(raw, safe=""), html.escape(raw), json.dumps(raw)[1:-1]}
    forms |= {html.escape(f) for f in list(forms)}
    return tuple(sorted((f for f in forms if f), key=len, reverse=True))
