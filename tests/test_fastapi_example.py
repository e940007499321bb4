"""examples/fastapi_service.py through a real ASGI server (uvicorn) and HTTP client, with
real worker and controller processes: a request enqueues a job and awaits its result;
many requests wait at once on one event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import pytest
import redis

from queueworks.contrib.redis_server import free_port
from tests.conftest import Cluster, need_module, wait_for

pytestmark = pytest.mark.system

need_module("fastapi", "pip install fastapi")
uvicorn = need_module("uvicorn", "pip install 'queueworks[dashboard]'")


@pytest.fixture
def service(
    cluster: Cluster, redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    monkeypatch.setenv("QUEUEWORKS_REDIS_URL", redis_url)
    monkeypatch.setenv("QUEUEWORKS_PREFIX", prefix)
    from examples.fastapi_service import app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 15, "the service to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def test_a_request_enqueues_a_job_and_awaits_its_result(
    cluster: Cluster, service: str, r: redis.Redis
) -> None:
    cluster.controller()
    cluster.worker(allow=("queueworks.examples",), extra=["--concurrency", "20"])
    cluster.wait_workers(r, 1)
    with httpx.Client(base_url=service, timeout=30) as http:
        got = http.post("/greet/Ada")
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["result"] == "hello Ada"
        status = http.get(f"/jobs/{body['job']}").json()
        assert status["state"] == "done" and status["attempts"] == 1 and status["worker"]
        assert http.get("/jobs/0123456789abcdef").status_code == 404

    async def many() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=service, timeout=30) as http:
            return await asyncio.gather(*(http.post(f"/greet/n{i}") for i in range(50)))

    replies = asyncio.run(many())
    assert [x.status_code for x in replies] == [200] * 50
    assert sorted(x.json()["result"] for x in replies) == sorted(f"hello n{i}" for i in range(50))


def test_a_job_not_done_in_time_is_202_with_its_id(service: str) -> None:
    """No worker at all: the request does not hang, it says the job is pending."""
    with httpx.Client(base_url=service, timeout=30) as http:
        got = http.post("/greet/Bob", params={"wait": 0.3})
        assert got.status_code == 202
        job = got.json()["job"]
        assert http.get(f"/jobs/{job}").json()["state"] == "queued"
