"""Redis connections: one way to build a client, and URLs that never show a password.

Three deployments, one URL each:

``redis://[[user]:password@]host[:port][/db]`` (``rediss://`` for TLS, ``unix://``)
    one server.
``redis+cluster://[[user]:password@]host:port[,host:port...][/0]`` (``rediss+cluster://``)
    a Redis Cluster, from any reachable seed nodes; the topology is discovered and followed.
``redis+sentinel://[[user]:password@]host:port[,host:port...]/<service>[/<db>]``
    (``rediss+sentinel://``) the primary that the sentinels name for ``<service>``, found
    again after a failover. The credentials are the primary's; sentinels that need their
    own take ``?sentinel_username=...&sentinel_password=...``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import parse_qsl, unquote, urlencode

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import SSLConnection, parse_url
from redis.exceptions import (
    AskError,
    ClusterError,
    MovedError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.retry import Retry
from redis.sentinel import Sentinel

from queueworks.errors import BadUrl, RedisUnavailable

if TYPE_CHECKING:
    from queueworks.settings import Settings

# Longer than any BLOCK the processes use: a blocking read must not hit the socket timeout.
SOCKET_TIMEOUT = 30.0
# Userinfo runs to the LAST "@" before the query: a password may hold an unencoded "@".
# Linear in the text it scans (error texts, tracebacks of any length): a scheme starts
# where no letter precedes it, and userinfo is at most 1,024 characters.
_CREDENTIALS = re.compile(r"(?<![a-z+])(?P<scheme>[a-z+]+://)(?P<cred>[^?#]{0,1024})@")
_SECRET_PARAMS = re.compile(r"(?P<name>[?&](?:sentinel_)?password=)[^&#]*", re.IGNORECASE)

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379

# "Redis is unavailable for now": every loop of the processes backs off and tries again.
# Beyond connection errors, a cluster answers CLUSTERDOWN (a slot without a primary, during
# a failover), TRYAGAIN (a multi-key command during a slot migration) or runs out of
# redirections while its slot map settles; and a MULTI whose slot is migrating ends in ASK
# or MOVED, which redis-py follows for a single command but not inside a transaction (the
# next try, once the slot has moved, goes to its new primary).
UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterError,
    TryAgainError,
    AskError,
    MovedError,
    SlotNotCoveredError,
    OSError,
)

# The client of every process: one server (or the primary a sentinel names) or a cluster.
Connection: TypeAlias = "redis.Redis | RedisCluster"

_URL_HELP = (
    "invalid Redis URL: expected redis://[[user]:password@]host[:port][/db], rediss://..., "
    "unix://..., redis+cluster://[[user]:password@]host:port[,host:port...] or "
    "redis+sentinel://[[user]:password@]host:port[,host:port...]/<service>[/<db>]; "
    "percent-encode / ? # @ : % in the password"
)


def redact_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host`` (also for the cluster and
    sentinel schemes, and for ``password=`` / ``sentinel_password=`` query parameters)."""

    def _mask(m: re.Match[str]) -> str:
        cred = m.group("cred")
        user = cred.split(":", 1)[0] if ":" in cred else ""
        return f"{m.group('scheme')}{user}:***@"

    return _SECRET_PARAMS.sub(r"\g<name>***", _CREDENTIALS.sub(_mask, url))


def as_cluster_url(url: str) -> str:
    """``redis://h:p`` -> ``redis+cluster://h:p`` (the ``--cluster`` flag); other URLs as is."""
    for plain in ("redis", "rediss"):
        if url.startswith(f"{plain}://"):
            return f"{plain}+cluster://{url[len(plain) + 3 :]}"
    return url


def connect_settings(settings: Settings) -> Connection:
    """The processes' connection: URL and TLS files from their settings."""
    return connect(
        settings.redis_url,
        ssl_ca_certs=settings.ssl_ca_certs,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )


def connect(
    url: str,
    *,
    ssl_ca_certs: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    socket_timeout: float = SOCKET_TIMEOUT,
    max_connections: int | None = None,
) -> Connection:
    """A client for ``url`` (see the module docstring for the schemes).

    No silent retries of commands: a retried XADD or INCR could apply twice. Every loop of
    the worker and controller catches connection errors itself and backs off; only the
    connect step is retried. In a cluster a connection error also refreshes the slot map, so
    the next attempt goes to the node that serves the slot now; through a sentinel the next
    connection asks the sentinels for the primary again.
    """
    kwargs = client_options(
        url, ssl_ca_certs, ssl_certfile, ssl_keyfile, socket_timeout, max_connections
    )
    try:
        target = parse_target(url)
        if target.kind == "cluster":
            return _cluster(target, kwargs)
        if target.kind == "sentinel":
            return _sentinel(target, kwargs)
        client = redis.Redis.from_url(url, retry=_no_retry(), **kwargs)
        pool = client.connection_pool
        pool.connection_class = reaching(pool.connection_class, redact_url(url))
        return client
    except BadUrl as exc:
        raise ValueError(f"{_URL_HELP} ({exc})") from None
    except ValueError:
        # redis-py's message may quote part of the URL, password included
        raise ValueError(_URL_HELP) from None


def client_options(
    url: str,
    ssl_ca_certs: str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    socket_timeout: float,
    max_connections: int | None,
) -> dict[str, Any]:
    """The connection options of every client (sync or asyncio) beside the URL's own."""
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": 5.0,
        "socket_keepalive": True,
        "health_check_interval": 10,
    }
    if max_connections is not None:
        kwargs["max_connections"] = max_connections
    if url.split("://", 1)[0] in ("rediss", "rediss+cluster", "rediss+sentinel"):
        if ssl_ca_certs:
            kwargs["ssl_ca_certs"] = ssl_ca_certs
        if ssl_certfile:
            kwargs["ssl_certfile"] = ssl_certfile
        if ssl_keyfile:
            kwargs["ssl_keyfile"] = ssl_keyfile
    return kwargs


def sentinel_options(target: Target, kwargs: dict[str, Any]) -> dict[str, Any]:
    """How to talk to the sentinels themselves: timeouts, TLS and their own credentials."""
    sentinel_kwargs = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    if target.options.get("ssl"):
        sentinel_kwargs["ssl"] = True
        for source in (target.options, kwargs):  # CA file etc. from the URL or the flags
            sentinel_kwargs.update({k: v for k, v in source.items() if k.startswith("ssl_")})
    sentinel_kwargs.update(target.sentinel_options or {})
    return sentinel_kwargs


def unreachable(where: str, exc: Exception) -> Exception:
    """A failure to connect to ``where`` as ``RedisUnavailable``; a refused login stays the
    ``AuthenticationError`` it is."""
    if isinstance(exc, redis.AuthenticationError | RedisUnavailable):
        return exc
    return RedisUnavailable(f"cannot reach Redis at {where}: {exc}")


def reaching(base: type[Any], where: str) -> type[Any]:
    """``base`` (a redis-py connection class) whose failure to connect is a
    ``RedisUnavailable`` naming ``where``, without redis-py's chain of socket errors; a
    refused login stays the ``AuthenticationError`` it is. Connected, it costs nothing."""

    class Reaching(base):  # type: ignore[misc]
        def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
            if self._sock:
                return
            try:
                super().connect_check_health(*args, **kwargs)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise unreachable(where, exc) from None

    Reaching.__name__ = Reaching.__qualname__ = base.__name__
    return Reaching


def _no_retry() -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=0.05, cap=1.0), 0)


@dataclass(frozen=True)
class Target:
    """A parsed URL: the kind of deployment, the hosts, and the rest as redis-py options."""

    kind: str  # "server" | "cluster" | "sentinel"
    hosts: tuple[tuple[str, int], ...]
    options: dict[str, Any]  # username, password, db, ssl, query options (redis-py types)
    service: str = ""
    sentinel_options: dict[str, Any] | None = None


def parse_target(url: str) -> Target:
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise BadUrl("no scheme")
    if scheme not in CLUSTER_SCHEMES + SENTINEL_SCHEMES:
        return Target("server", (), {})
    plain = scheme.split("+", 1)[0]
    rest, _, query = rest.partition("?")
    userinfo, at, hostpart = rest.rpartition("@")
    hostlist, _, path = hostpart.partition("/")
    default_port = SENTINEL_PORT if scheme in SENTINEL_SCHEMES else 6379
    hosts = tuple(_host_port(h, default_port) for h in hostlist.split(",") if h.strip())
    if not hosts:
        raise BadUrl("no host")
    params = parse_qsl(query, keep_blank_values=True)
    sentinel_params = {k: v for k, v in params if k.startswith("sentinel_")}
    params = [(k, v) for k, v in params if not k.startswith("sentinel_")]
    segments = [unquote(s) for s in path.split("/") if s]
    service, db = "", "0"
    if scheme in SENTINEL_SCHEMES:
        if not segments:
            raise BadUrl("a sentinel URL names the service: redis+sentinel://h:p/<service>")
        service, db = segments[0], segments[1] if len(segments) > 1 else "0"
        if len(segments) > 2:
            raise BadUrl("expected /<service>[/<db>]")
    else:
        if len(segments) > 1 or (segments and segments[0] != "0"):
            raise BadUrl("a Redis Cluster has only database 0")
    # redis-py parses credentials and query options (types, percent-decoding) of one host.
    host, port = hosts[0]
    first = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    single = f"{plain}://{userinfo}{at}{first}/{db}"
    if params:
        single += "?" + urlencode(params)
    options = dict(parse_url(single))  # type: ignore[no-untyped-call, unused-ignore]
    options.pop("host", None)
    options.pop("port", None)
    if options.pop("connection_class", None) is SSLConnection:
        options["ssl"] = True
    if scheme in CLUSTER_SCHEMES:
        options.pop("db", None)
        return Target("cluster", hosts, options)
    sentinel: dict[str, Any] = {}
    for name in ("sentinel_username", "sentinel_password"):
        if name in sentinel_params:
            sentinel[name.removeprefix("sentinel_")] = sentinel_params.pop(name)
    if sentinel_params:
        raise BadUrl(f"unknown sentinel option(s): {', '.join(sorted(sentinel_params))}")
    return Target("sentinel", hosts, options, service=service, sentinel_options=sentinel)


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    text = text.strip()
    if text.startswith("["):  # [v6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    try:
        return host, int(port) if port else default_port
    except ValueError:
        raise BadUrl(f"bad port in host list entry {host!r}") from None


def _cluster(target: Target, kwargs: dict[str, Any]) -> RedisCluster:
    """The cluster client learns the topology at once: a seed must answer now."""
    nodes = [ClusterNode(h, p) for h, p in target.hosts]  # type: ignore[no-untyped-call, unused-ignore]
    try:
        return RedisCluster(startup_nodes=nodes, retry=_no_retry(), **target.options, **kwargs)
    except redis.exceptions.RedisClusterException as exc:  # not a RedisError: say what it is
        seeds = ",".join(f"{h}:{p}" for h, p in target.hosts)
        raise redis.ConnectionError(
            f"no seed node of the cluster answered ({seeds}): {exc}"
        ) from None


def _sentinel(target: Target, kwargs: dict[str, Any]) -> redis.Redis:
    sentinel_kwargs = sentinel_options(target, kwargs)
    sentinel_kwargs["retry"] = _no_retry()
    sentinels = Sentinel(list(target.hosts), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call, unused-ignore]
    client: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        target.service, retry=_no_retry(), **target.options, **kwargs
    )
    return client


def one_command(r: Connection, *args: Any) -> Any:
    """Run one command and return its raw reply (no response callback), on a connection of
    ``r``'s pool but without redis-py's per-call machinery around it (retry wrapper, option
    handling, observability hooks): a few microseconds less per call, for the hottest call
    of the client, the enqueue of one job (``Queue.enqueue``: an ``XADD``), and of a queue's
    member, its blocking read. As redis-py does: a connection that met an error (not an
    error reply) is disconnected before it goes back to the pool (the next use
    reconnects); the error is raised; nothing is retried. A cluster client runs it as
    usual (it routes each command by its key)."""
    if isinstance(r, RedisCluster):
        cluster: Any = r
        return cluster.execute_command(*args)
    pool = r.connection_pool
    conn: Any = pool.get_connection()
    try:
        conn.send_command(*args)
        return conn.read_response()
    except redis.ResponseError:
        raise  # an error reply, read whole: the connection is as good as before
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
