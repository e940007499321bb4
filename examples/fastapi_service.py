"""A FastAPI service that enqueues a job per request and awaits its result, with
``queueworks.AsyncClient``: the request's coroutine waits; the event loop serves others.

    pip install fastapi uvicorn
    queueworks controller &
    queueworks worker --allow queueworks.examples &
    uvicorn examples.fastapi_service:app --port 8000
    curl -X POST localhost:8000/greet/Ada        # {"job": "...", "result": "hello Ada"}

``QUEUEWORKS_REDIS_URL`` and ``QUEUEWORKS_PREFIX`` say where the queue is.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from queueworks import AsyncClient, JobFailed


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    client = AsyncClient.from_url(
        os.environ.get("QUEUEWORKS_REDIS_URL", "redis://localhost:6379/0"),
        prefix=os.environ.get("QUEUEWORKS_PREFIX", "qw"),
    )
    app.state.queue = await client.queue("greetings")  # create or open, once
    try:
        yield
    finally:
        await client.close()


app = FastAPI(title="greetings", lifespan=lifespan)


@app.post("/greet/{name}")
async def greet(name: str, request: Request, wait: float = 10.0) -> Any:
    """Enqueue a job, and wait for it up to ``wait`` s: its result, or 202 with its id."""
    job = await request.app.state.queue.enqueue("queueworks.examples:greet", {"name": name})
    try:
        return {"job": job.id, "result": await job.result(timeout=wait)}
    except JobFailed as exc:
        raise HTTPException(status_code=500, detail=f"job {job.id}: {exc.reason}") from None
    except TimeoutError:
        return JSONResponse({"job": job.id, "state": "pending"}, status_code=202)


@app.get("/jobs/{job_id}")
async def job(job_id: str, request: Request) -> Any:
    """A job's status (state, attempts, worker, times, error)."""
    try:
        status = await request.app.state.queue.job(job_id).status()
    except LookupError:
        raise HTTPException(status_code=404, detail=f"no job {job_id}") from None
    return status.model_dump(mode="json")
