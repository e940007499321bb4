"""A new user's first steps hold: the client finds the Redis the commands use, through the
same variable and default (``Client.from_env``, ``AsyncClient.from_env``)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from queueworks import AsyncClient, Client

pytestmark = pytest.mark.integration


def test_client_from_env_reads_the_commands_variables(
    redis_url: str, prefix: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUEUEWORKS_REDIS_URL", redis_url)
    monkeypatch.setenv("QUEUEWORKS_PREFIX", prefix)
    with Client.from_env() as client:
        client.queue("first")
    assert r.sismember(f"{prefix}:queues", "first")


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


def test_from_env_defaults_as_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """No variable: redis://localhost:6379/0 and prefix qw, as the CLI (no I/O here)."""
    monkeypatch.delenv("QUEUEWORKS_REDIS_URL", raising=False)
    monkeypatch.delenv("QUEUEWORKS_PREFIX", raising=False)
    client = Client.from_env()
    kwargs = client.redis.connection_pool.connection_kwargs  # type: ignore[union-attr]
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == ("localhost", 6379, 0)
    assert client.keys.prefix == "qw"
    client.close()
