"""A job's progress (``ctx.progress``): reported by its handler while it runs, read by
``job.status()`` (sync and async clients), kept once it is done. Validation and the
record's partial form: ``tests/test_progress_records.py``."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable

import pytest
import redis

from queueworks import AsyncClient, Client, JobFailed
from queueworks.cli.info import render
from queueworks.protocol.models import JobState, JobStatus
from tests.conftest import Cluster, wait_for
from tests.test_dashboard import make_app

pytestmark = pytest.mark.system


def _rises(status: Callable[[], JobStatus], r: redis.Redis, gate: str, steps: int) -> None:
    """Each step's report is seen while the job runs, then its gate is opened."""
    for i in range(1, steps + 1):
        want = i / (steps + 1)

        def reported(want: float = want) -> JobStatus | None:
            s = status()
            return s if s.progress == want else None

        seen = wait_for(reported, 30, f"progress {want}")
        assert seen.state == JobState.RUNNING
        assert seen.progress_message == f"step {i}"
        r.set(f"{gate}:{i}", 1)


@pytest.mark.parametrize("handler", ["progress_steps", "async_progress_steps"])
def test_progress_rises_while_the_job_runs_and_its_last_value_stays(
    cluster: Cluster, client: Client, r: redis.Redis, handler: str
) -> None:
    cluster.worker()
    q = client.queue("progress")
    gate = f"{cluster.prefix}:gate:{uuid.uuid4().hex[:6]}"
    job = q.enqueue(f"tests.handlers:{handler}", {"gate": gate, "steps": 3})
    assert job.status().progress is None  # no report yet
    _rises(job.status, r, gate, 3)
    assert job.result(timeout=30) == 3
    done = job.status()
    # the burst's last report (coalesced) is written before the settle, and stays
    assert (done.state, done.progress, done.progress_message) == (
        JobState.DONE,
        0.999,
        "finishing",
    )
    assert done.handler == f"tests.handlers:{handler}" and done.enqueued_at > 0


def test_the_async_client_reads_a_running_jobs_progress(
    cluster: Cluster, redis_url: str, prefix: str, r: redis.Redis
) -> None:
    cluster.worker()
    gate = f"{prefix}:gate:{uuid.uuid4().hex[:6]}"

    async def main() -> JobStatus:
        async with AsyncClient.from_url(redis_url, prefix=prefix) as ac:
            q = await ac.queue("aprogress")
            job = await q.enqueue("tests.handlers:progress_steps", {"gate": gate, "steps": 2})
            for i in (1, 2):
                while (s := await job.status()).progress != i / 3:
                    await asyncio.sleep(0.02)
                assert (s.state, s.progress_message) == (JobState.RUNNING, f"step {i}")
                r.set(f"{gate}:{i}", 1)
            assert await job.result(timeout=30) == 2
            return await job.status()

    done = asyncio.run(asyncio.wait_for(main(), 60))
    assert (done.state, done.progress, done.progress_message) == (JobState.DONE, 0.999, "finishing")


def test_a_progress_out_of_range_is_the_handlers_error(cluster: Cluster, client: Client) -> None:
    cluster.worker()
    q = client.queue("badprogress", max_attempts=1)
    job = q.enqueue("tests.handlers:bad_progress", {"fraction": 1.5})
    with pytest.raises(JobFailed) as failed:
        job.result(timeout=30)
    assert "ValueError: progress fraction must be a number from 0 to 1, not 1.5" in (
        failed.value.traceback
    )
    assert job.status().progress is None


def test_info_and_the_queue_page_show_running_jobs_with_their_progress(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    cluster.worker()
    q = client.queue("shown")
    gate = f"{cluster.prefix}:gate:{uuid.uuid4().hex[:6]}"
    job = q.enqueue("tests.handlers:progress_steps", {"gate": gate, "steps": 1})
    wait_for(lambda: job.status().progress == 0.5, 30, "the first report")

    (running,) = client.running_jobs("shown")
    assert (running.id, running.state, running.progress) == (job.id, JobState.RUNNING, 0.5)
    assert [(j.id, j.progress, j.progress_message) for j in q.running()] == [
        (job.id, 0.5, "step 1")
    ]
    text = render(client)
    (line,) = [x for x in text.splitlines() if x.strip().startswith(f"running {job.id}")]
    assert "tests.handlers:progress_steps" in line and "[#####.....] 50% step 1" in line
    as_json = json.loads(render(client, as_json=True))
    assert as_json["running_jobs"]["shown"][0]["progress_message"] == "step 1"
    with make_app(client) as web:
        page = web.get("/queues/shown").text
        api = web.get(f"/api/queues/shown/jobs/{job.id}")
        assert api.status_code == 200
        assert (api.json()["state"], api.json()["progress"]) == ("running", 0.5)
        for path in ("/api/queues/shown/jobs/1-0", "/api/queues/none/jobs/1-0"):
            assert web.get(path).status_code == 404, path
        # decoded, it is a job's action (POST only): refused either way, never a job
        assert web.get("/api/queues/shown/jobs/..%2Fx").status_code in (404, 405)
    row = page[page.index(f'<tr data-job="{job.id}">') :]
    row = row[: row.index("</tr>")]
    assert "tests.handlers:progress_steps" in row and "50%" in row and "step 1" in row

    r.set(f"{gate}:1", 1)
    assert job.result(timeout=30) == 1
    assert client.running_jobs("shown") == []
