"""A Flask app that enqueues a job per request and reads its result, with
``queueworks.Client``: one client for the app, made once; a request waits for the result up
to ``wait`` seconds, else answers 202 with the job's id to ask for later.

    pip install 'queueworks' flask
    queueworks controller &
    queueworks worker --allow queueworks.examples &
    flask --app examples.flask_app run --port 8000
    curl -X POST localhost:8000/greet/Ada        # {"job": "...", "result": "hello Ada"}
    curl localhost:8000/jobs/JOB_ID              # its status: state, attempts, worker, times

``QUEUEWORKS_REDIS_URL`` and ``QUEUEWORKS_PREFIX`` say where the queue is.
"""

from __future__ import annotations

from typing import Any

from flask import Flask, abort, request

from queueworks import Client, JobFailed


def create_app(client: Client | None = None) -> Flask:
    app = Flask(__name__)
    client = client or Client.from_env()  # QUEUEWORKS_REDIS_URL, QUEUEWORKS_PREFIX
    queue = client.queue("greetings")  # create or open, once

    @app.post("/greet/<name>")
    def greet(name: str) -> Any:
        """Enqueue a job, and wait for it up to ``wait`` s: its result, or 202 with its id."""
        wait = request.args.get("wait", 10.0, float)
        job = queue.enqueue("queueworks.examples:greet", {"name": name})
        try:
            return {"job": job.id, "result": job.result(timeout=wait)}
        except JobFailed as exc:
            abort(500, f"job {job.id}: {exc.reason}")
        except TimeoutError:
            return {"job": job.id, "state": "pending"}, 202

    @app.get("/jobs/<job_id>")
    def job(job_id: str) -> Any:
        """A job's status (state, attempts, worker, times, error)."""
        try:
            return queue.job(job_id).status().model_dump(mode="json")
        except LookupError:
            abort(404, f"no job {job_id}")

    return app
