"""A new user's first steps hold: the client finds the Redis the commands use, through the
same variable and default (``Client.from_env``, ``AsyncClient.from_env``); the demo
leaves nothing in a Redis it borrowed."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import pytest
import redis

from queueworks import AsyncClient, Client
from queueworks.contrib.redis_server import RedisServer
from tests.conftest import ROOT


@pytest.mark.integration
def test_client_from_env_reads_the_commands_variables(
    redis_url: str, prefix: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUEUEWORKS_REDIS_URL", redis_url)
    monkeypatch.setenv("QUEUEWORKS_PREFIX", prefix)
    with Client.from_env() as client:
        client.queue("first")
    assert r.sismember(f"{prefix}:queues", "first")


@pytest.mark.integration
def test_async_client_from_env_reads_the_commands_variables(
    redis_url: str, prefix: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUEUEWORKS_REDIS_URL", redis_url)
    monkeypatch.setenv("QUEUEWORKS_PREFIX", prefix)

    async def first() -> None:
        async with AsyncClient.from_env() as client:
            await client.queue("first-async")

    asyncio.run(first())
    assert r.sismember(f"{prefix}:queues", "first-async")


@pytest.mark.unit
def test_from_env_defaults_as_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """No variable: redis://localhost:6379/0 and prefix qw, as the CLI (no I/O here)."""
    monkeypatch.delenv("QUEUEWORKS_REDIS_URL", raising=False)
    monkeypatch.delenv("QUEUEWORKS_PREFIX", raising=False)
    client = Client.from_env()
    kwargs = client.redis.connection_pool.connection_kwargs  # type: ignore[union-attr]
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("localhost", 6379, 0)
    assert client.keys.prefix == "qw"
    client.close()


@pytest.mark.system
def test_demo_in_a_borrowed_redis_leaves_nothing_behind() -> None:
    """``queueworks demo`` on a Redis that answers (not one it started) keeps to a prefix of
    its own and deletes it at the end: the keys that were there are all that is left."""
    with RedisServer() as server:
        r = server.client()
        r.set("mine", "kept")
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUEWORKS_")}
        args = ["demo", "--workers", "1", "--subtasks", "20", "--redis", server.url]
        out = subprocess.run(
            [sys.executable, "-m", "queueworks", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert "done=20 dead=0" in out.stdout, out.stdout[-2000:]
        said = re.search(r"keys under prefix (demo-\w+), deleted when the demo ends", out.stdout)
        assert said, out.stdout[-2000:]
        assert sorted(r.keys("*")) == [b"mine"], sorted(r.keys("*"))[:20]
        r.close()
