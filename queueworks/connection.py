"""Redis connections: one way to build a client, and URLs that never show a password."""

from __future__ import annotations

import re
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

# Longer than any BLOCK the processes use: a blocking read must not hit the socket timeout.
SOCKET_TIMEOUT = 30.0
_CREDENTIALS = re.compile(r"(?P<scheme>[a-z+]+://)(?P<cred>[^@/]*)@")


def redact_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host``."""

    def _mask(m: re.Match[str]) -> str:
        cred = m.group("cred")
        user = cred.split(":", 1)[0] if ":" in cred else ""
        return f"{m.group('scheme')}{user}:***@"

    return _CREDENTIALS.sub(_mask, url)


def connect(
    url: str,
    *,
    ssl_ca_certs: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    socket_timeout: float = SOCKET_TIMEOUT,
    max_connections: int | None = None,
) -> redis.Redis:
    """A client for ``url`` (redis://, rediss://, unix://).

    No silent retries of commands: a retried XADD or INCR could apply twice. Every loop of
    the worker and controller catches connection errors itself and backs off; only the
    connect step is retried.
    """
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": 5.0,
        "socket_keepalive": True,
        "health_check_interval": 10,
        "retry": Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 0),
    }
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    if url.startswith("rediss://"):
        if ssl_ca_certs:
            kwargs["ssl_ca_certs"] = ssl_ca_certs
        if ssl_certfile:
            kwargs["ssl_certfile"] = ssl_certfile
        if ssl_keyfile:
            kwargs["ssl_keyfile"] = ssl_keyfile
    try:
        return redis.Redis.from_url(url, **kwargs)
    except ValueError:
        # redis-py's message may quote part of the URL, password included
        raise ValueError(
            "invalid Redis URL: expected redis://[[user]:password@]host[:port][/db], "
            "rediss://... or unix://...; percent-encode / ? # @ : % in the password"
        ) from None


def text(value: object) -> str:
    """A Redis reply (bytes) as text; redis-py's reply types are unions, so accept any."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)
