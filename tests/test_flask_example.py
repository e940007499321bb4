"""examples/flask_app.py through a real WSGI server (werkzeug's) and HTTP client, with real
worker and controller processes: a request enqueues a job and reads its result."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
import redis

from queueworks import Client
from tests.conftest import Cluster, need_module

pytestmark = pytest.mark.system

need_module("flask", "pip install flask")
from werkzeug.serving import make_server  # noqa: E402

from examples.flask_app import create_app  # noqa: E402


@pytest.fixture
def service(client: Client) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, create_app(client), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(15)


def test_a_request_enqueues_a_job_and_reads_its_result(
    cluster: Cluster, service: str, r: redis.Redis
) -> None:
    with httpx.Client(base_url=service, timeout=30) as http:
        pending = http.post("/greet/Bob", params={"wait": 0.2})  # no worker yet
        assert pending.status_code == 202
        queued = pending.json()["job"]
        assert http.get(f"/jobs/{queued}").json()["state"] == "queued"
        assert http.get("/jobs/0123456789abcdef").status_code == 404

        cluster.controller()
        cluster.worker(allow=("queueworks.examples",))
        cluster.wait_workers(r, 1)
        got = http.post("/greet/Ada")
        assert got.status_code == 200, got.text
        body = got.json()
        assert body["result"] == "hello Ada"
        status = http.get(f"/jobs/{body['job']}").json()
        assert status["state"] == "done" and status["attempts"] == 1 and status["worker"]
        assert http.get(f"/jobs/{queued}").json()["state"] == "done"  # the one that waited
