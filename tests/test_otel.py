"""Tracing (``queueworks.otel``): a job's trace from the enqueue to the handler, across real
processes, exported by the real SDK over OTLP/HTTP to a receiver the test runs (decoding
with ``opentelemetry-proto``); the log lines that name a job; and a worker without
OpenTelemetry installed, which runs as it does without tracing."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import redis

from queueworks import Client, JobFailed, TaskSpec
from queueworks.dashboard import DashboardConfig
from queueworks.logs import default_format
from queueworks.protocol.job_options import JobOptions
from tests.conftest import ROOT, Cluster, missing, wait_for
from tests.test_dashboard import make_app

try:
    import opentelemetry.exporter.otlp.proto.http
    import opentelemetry.instrumentation
    import opentelemetry.sdk  # noqa: F401
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
except ImportError:  # pragma: no cover
    missing("the otel extra", "pip install -e '.[dev,otel]'")

ALLOW = "tests.handlers_otel"


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class Receiver:
    """An OTLP/HTTP trace receiver on a free port: every span posted to ``/v1/traces``,
    decoded, with its service's name."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                receiver.take(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self, request: Any) -> None:
        for rs in request.resource_spans:
            service = _attrs(rs.resource.attributes).get("service.name")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    span = {
                        "service": service,
                        "name": s.name,
                        "kind": s.kind,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent": s.parent_span_id.hex(),
                        "attributes": _attrs(s.attributes),
                        "status": s.status.code,
                        "events": [(e.name, _attrs(e.attributes)) for e in s.events],
                        "links": [(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                    }
                    with self.lock:
                        self.spans.append(span)

    def find(self, name: str, **attributes: Any) -> list[dict[str, Any]]:
        with self.lock:
            return [
                s
                for s in self.spans
                if s["name"] == name
                and all(s["attributes"].get(k) == v for k, v in attributes.items())
            ]

    def one(self, name: str, timeout: float = 30.0, count: int = 1, **attributes: Any) -> Any:
        found = wait_for(
            lambda: len(self.find(name, **attributes)) >= count and self.find(name, **attributes),
            timeout,
            f"{count} span(s) {name} {attributes}: have {[s['name'] for s in self.spans]}",
        )
        return found[0] if count == 1 else found

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rcv = Receiver()
    yield rcv
    rcv.close()


@pytest.fixture
def traced_client(receiver: Receiver, client: Client) -> Iterator[Client]:
    """This process as an instrumented producer (the SDK, exporting to ``receiver``)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from queueworks.otel import QueueworksInstrumentor

    provider = TracerProvider(resource=Resource({"service.name": "producer"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"))
    )
    instrumentor = QueueworksInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield client
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


def otel_env(receiver: Receiver, service: str) -> dict[str, str]:
    return {
        "OTEL_SERVICE_NAME": service,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


def log_events(text: str, name: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            event = json.loads(line)
            if event["event"] == name:
                out.append(event)
    return out


CONSUMER, PRODUCER = ProtoSpan.SPAN_KIND_CONSUMER, ProtoSpan.SPAN_KIND_PRODUCER
ERROR = 2  # Status.STATUS_CODE_ERROR


@pytest.mark.system
def test_a_jobs_trace_joins_the_enqueue_to_its_handler_across_processes(
    cluster: Cluster, traced_client: Client, receiver: Receiver, r: redis.Redis
) -> None:
    """A producer (this process, instrumented) and a worker started with --otel: the
    worker's ``process`` span is a child of the producer's ``send`` span, the handler's own
    span a child of the ``process`` span; the messaging attributes; a failure's status,
    exception event, retry and dead letter; a deferred job's link; the worker's job lines
    and the handler's ``ctx.log`` lines carry the job and its trace."""
    name = f"otel-{uuid.uuid4().hex[:6]}"
    w = cluster.worker(allow=(ALLOW,), extra=["--otel"], env=otel_env(receiver, "worker-svc"))
    cluster.wait_workers(r, 1)
    q = traced_client.queue(name, max_attempts=2, retry_delay=0)
    ok = q.enqueue("tests.handlers_otel:traced", {"x": 7})
    assert ok.result(timeout=30) == {"x": 7}
    bad = q.enqueue("tests.handlers_otel:fails", 1)
    with pytest.raises(JobFailed):
        bad.result(timeout=30)
    after = q.enqueue("tests.handlers_otel:traced", {"x": 8}, depends_on=[ok])
    assert after.result(timeout=30) == {"x": 8}

    send = receiver.one(f"send {name}", **{"messaging.message.id": ok.id})
    assert send["service"] == "producer" and send["kind"] == PRODUCER
    assert send["attributes"]["messaging.system"] == "queueworks"
    assert send["attributes"]["messaging.operation.type"] == "send"
    assert send["attributes"]["messaging.destination.name"] == name
    process = receiver.one(f"process {name}", **{"messaging.message.id": ok.id})
    assert process["service"] == "worker-svc" and process["kind"] == CONSUMER
    assert (process["trace_id"], process["parent"]) == (send["trace_id"], send["span_id"])
    assert process["attributes"] == {
        "messaging.system": "queueworks",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": name,
        "messaging.message.id": ok.id,
        "messaging.client.id": w.name,
        "queueworks.job.attempt": 1,
        "queueworks.job.handler": "tests.handlers_otel:traced",
    }
    assert process["status"] != ERROR and process["events"] == []
    inner = wait_for(
        lambda: [s for s in receiver.find("inner") if s["parent"] == process["span_id"]],
        30,
        "the handler's own span, under the job's",
    )
    assert inner[0]["trace_id"] == send["trace_id"]

    bad_send = receiver.one(f"send {name}", **{"messaging.message.id": bad.id})
    tries = receiver.one(f"process {name}", count=2, **{"messaging.message.id": bad.id})
    tries.sort(key=lambda s: s["attributes"]["queueworks.job.attempt"])
    assert [s["attributes"]["queueworks.job.attempt"] for s in tries] == [1, 2]
    for s in tries:
        assert (s["trace_id"], s["parent"]) == (bad_send["trace_id"], bad_send["span_id"])
        assert s["status"] == ERROR and s["attributes"]["error.type"] == "ValueError"
        exception = [e for n, e in s["events"] if n == "exception"]
        assert exception and exception[0]["exception.type"] == "ValueError"
        assert "bad input 1" in exception[0]["exception.message"]
    assert [n for n, _ in tries[0]["events"]] == ["exception", "retry"]
    assert [n for n, _ in tries[1]["events"]] == ["exception", "dead_letter"]

    deferred_send = receiver.one(f"send {name}", **{"messaging.message.id": after.id})
    deferred = receiver.one(f"process {name}", **{"messaging.message.id": after.id})
    assert deferred["parent"] == "" and deferred["trace_id"] != deferred_send["trace_id"]
    assert deferred["links"] == [(deferred_send["trace_id"], deferred_send["span_id"])]

    # the trace's id, kept with the job: on its detail and its dashboard page, linked
    assert ok.detail().trace_id == send["trace_id"]  # a done job: its record's
    assert bad.detail().trace_id == bad_send["trace_id"]  # a dead one
    pending = q.enqueue("tests.handlers_otel:traced", {"x": 9}, delay=600)
    waiting = receiver.one(f"send {name}", **{"messaging.message.id": pending.id})
    assert pending.detail().trace_id == waiting["trace_id"]  # a waiting one: its options'
    assert pending.cancel() and not ok.cancel()
    cancels = receiver.one(f"cancel {name}", count=2)
    events = {s["attributes"]["messaging.message.id"]: s["events"] for s in cancels}
    assert events == {pending.id: [("cancelled", {})], ok.id: []}
    trace_url = "https://tracing.example/trace/{trace_id}"
    with make_app(traced_client, trace_url=trace_url) as web:
        page = web.get(f"/queues/{name}/jobs/{ok.id}")
        assert page.status_code == 200
        link = f'href="https://tracing.example/trace/{send["trace_id"]}"'
        assert link in page.text
        assert web.get(f"/api/queues/{name}/jobs/{ok.id}").json()["trace_id"] == send["trace_id"]
    with pytest.raises(ValueError, match="trace-url"):
        DashboardConfig(redis_url="redis://x", trace_url="https://tracing.example/trace/")

    log = w.log()
    for event in ("job_started", "job_done"):
        [line] = [e for e in log_events(log, event) if e["job_id"] == ok.id]
        assert (line["queue"], line["attempt"]) == (name, 1)
        assert (line["trace_id"], line["span_id"]) == (process["trace_id"], process["span_id"])
    assert log_events(log, "job_done")[0]["seconds"] >= 0
    [said] = [e for e in log_events(log, "handler_said") if e["x"] == 7]
    assert (said["job_id"], said["queue"], said["attempt"]) == (ok.id, name, 1)
    assert (said["trace_id"], said["span_id"]) == (process["trace_id"], process["span_id"])
    failed = [e for e in log_events(log, "job_failed") if e["job_id"] == bad.id]
    assert [e["attempt"] for e in failed] == [1, 2] and "bad input 1" in failed[0]["error"]
    assert {e["trace_id"] for e in failed} == {bad_send["trace_id"]}
    [dead] = log_events(log, "job_dead")
    assert (dead["job_id"], dead["queue"], dead["attempt"]) == (bad.id, name, 2)
    assert dead["span_id"] == tries[1]["span_id"]


@pytest.mark.system
def test_coroutines_in_flight_run_under_their_own_jobs_spans(
    cluster: Cluster, traced_client: Client, receiver: Receiver, r: redis.Redis
) -> None:
    """``--concurrency 8``, ``async def`` handlers in flight together: each job's handler
    runs with its own ``process`` span current (its inner span, its log line)."""
    name = f"otel-aio-{uuid.uuid4().hex[:6]}"
    w = cluster.worker(
        allow=(ALLOW,),
        extra=["--otel", "--concurrency", "8"],
        env=otel_env(receiver, "worker-svc"),
    )
    cluster.wait_workers(r, 1)
    q = traced_client.queue(name)
    jobs = traced_client.queue(name).enqueue_many(
        [("tests.handlers_otel:traced_async", i) for i in range(16)]
    )
    assert [j.result(timeout=30) for j in jobs] == [i + 1 for i in range(16)]
    [send] = receiver.find(f"send {name}")  # one span for the batch
    assert send["attributes"]["messaging.batch.message_count"] == 16
    processes = receiver.one(f"process {name}", count=16)
    assert {p["attributes"]["messaging.message.id"] for p in processes} == {j.id for j in jobs}
    assert all(p["parent"] == send["span_id"] for p in processes)
    by_span = {p["span_id"]: p for p in processes}
    inner = wait_for(
        lambda: len(receiver.find("inner_async")) >= 16 and receiver.find("inner_async"),
        30,
        "the handlers' own spans",
    )
    assert sorted(s["parent"] for s in inner) == sorted(by_span)
    said = log_events(w.log(), "handler_said")
    assert len(said) == 16
    for line in said:
        assert by_span[line["span_id"]]["attributes"]["messaging.message.id"] == line["job_id"]
    assert q.status().done == 16


@pytest.mark.system
def test_a_job_cancelled_while_it_ran_ends_its_span_with_a_cancelled_event(
    cluster: Cluster, traced_client: Client, receiver: Receiver, r: redis.Redis
) -> None:
    """``job.cancel()`` on a running job: its ``process`` span ends with a ``cancelled``
    event, not as a failure (no error status, no exception, no retry); the worker's lines
    about the stop name the job."""
    from queueworks.protocol.models import JobState

    name = f"otel-cancel-{uuid.uuid4().hex[:6]}"
    w = cluster.worker(allow=(ALLOW,), extra=["--otel"], env=otel_env(receiver, "worker-svc"))
    cluster.wait_workers(r, 1)
    job = traced_client.queue(name).enqueue("tests.handlers_otel:waits", 30)
    wait_for(lambda: job.status().state == JobState.RUNNING, 60, "the job running")
    assert job.cancel()
    span = receiver.one(f"process {name}", **{"messaging.message.id": job.id})
    assert [n for n, _ in span["events"]] == ["cancelled"]
    assert "cancelled while it ran" in span["events"][0][1]["queueworks.job.reason"]
    assert span["status"] != ERROR and "error.type" not in span["attributes"]
    assert job.status().state == JobState.CANCELLED
    # the worker's lines about it name the job, its queue and attempt (the last, its trace)
    for event in ("job_stopped", "stopped_job_dropped"):
        [line] = wait_for(lambda e=event: log_events(w.log(), e), 30, f"the {event} line")
        assert (line["job_id"], line["queue"], line["attempt"]) == (job.id, name, 1)
    [dropped] = log_events(w.log(), "stopped_job_dropped")
    assert (dropped["trace_id"], dropped["span_id"]) == (span["trace_id"], span["span_id"])


@pytest.mark.system
def test_traced_jobs_of_a_group_keep_their_trace_and_give_their_slot_back(
    cluster: Cluster, traced_client: Client, receiver: Receiver, r: redis.Redis
) -> None:
    """Jobs of a group (``group_limit=1``) enqueued and run while tracing: each settle gives
    the group's slot back (the next job runs) and keeps each done job's trace id on its
    record (both ride on the same settle)."""
    name = f"otel-group-{uuid.uuid4().hex[:6]}"
    cluster.worker(allow=(ALLOW,), extra=["--otel"], env=otel_env(receiver, "worker-svc"))
    cluster.wait_workers(r, 1)
    q = traced_client.queue(name, group_limit=1)
    jobs = [q.enqueue("tests.handlers_otel:plain", i, group="g") for i in range(4)]
    assert [j.result(timeout=30) for j in jobs] == [0, 2, 4, 6]
    for job in jobs:
        send = receiver.one(f"send {name}", **{"messaging.message.id": job.id})
        process = receiver.one(f"process {name}", **{"messaging.message.id": job.id})
        assert process["trace_id"] == send["trace_id"] == job.detail().trace_id
    assert r.hlen(q.keys.groups_held) == 0


@pytest.mark.system
def test_a_periodic_jobs_runs_link_to_where_it_was_scheduled(
    cluster: Cluster, traced_client: Client, receiver: Receiver, r: redis.Redis
) -> None:
    """A schedule written under a span: each job the controller fires from it is processed
    in a trace of its own whose ``process`` span links to that span."""
    from opentelemetry.sdk.trace import TracerProvider

    cluster.controller()
    cluster.worker(allow=(ALLOW,), extra=["--otel"], env=otel_env(receiver, "worker-svc"))
    cluster.wait_workers(r, 1)
    name = f"otel-cron-{uuid.uuid4().hex[:6]}"
    q = traced_client.queue(name)
    with TracerProvider().get_tracer("t").start_as_current_span("deploy") as span:
        q.schedule("tick", "tests.handlers_otel:plain", 3, every=0.5)
    made = span.get_span_context()
    runs = receiver.one(f"process {name}", count=2)
    for run in runs:
        assert run["parent"] == "" and run["trace_id"] != f"{made.trace_id:032x}"
        assert run["links"] == [(f"{made.trace_id:032x}", f"{made.span_id:016x}")]
    assert len({run["trace_id"] for run in runs}) == len(runs)
    q.unschedule("tick")


@pytest.mark.system
@pytest.mark.parametrize("each", [False, True], ids=["batches", "and-each"])
def test_a_tasks_subtasks_are_processed_in_batch_spans_under_its_submit(
    cluster: Cluster, traced_client: Client, receiver: Receiver, r: redis.Redis, each: bool
) -> None:
    """A task's submit is a ``send`` span; a worker runs its subtasks in ``process`` spans,
    each a child of it, one per batch run, counting the subtasks it ran; asked for
    (``QUEUEWORKS_OTEL_SUBTASK_SPANS=1``), a span per subtask too, under its batch's. The
    controller runs with ``--otel`` too."""
    cluster.controller(extra=["--otel"])
    env = otel_env(receiver, "worker-svc")
    if each:
        env["QUEUEWORKS_OTEL_SUBTASK_SPANS"] = "1"
    cluster.worker(allow=(ALLOW,), extra=["--otel"], env=env)
    cluster.wait_workers(r, 1)
    name = f"task-{uuid.uuid4().hex[:6]}"
    spec = TaskSpec(name=name, handler="tests.handlers_otel:plain", subtasks=list(range(20)))
    task = traced_client.submit(spec)
    task.wait(timeout=60)
    assert dict(task.results()) == {i: 2 * i for i in range(20)}
    send = receiver.one(f"send {name}")
    assert send["kind"] == PRODUCER and send["attributes"]["messaging.message.id"] == task.id
    assert send["attributes"]["messaging.batch.message_count"] == 20

    def batches() -> list[dict[str, Any]]:
        spans = receiver.find(f"process {name}")
        return [s for s in spans if "messaging.batch.message_count" in s["attributes"]]

    def all_processed() -> list[dict[str, Any]] | None:
        spans = batches()
        total = sum(s["attributes"]["messaging.batch.message_count"] for s in spans)
        return spans if total >= 20 else None

    spans = wait_for(all_processed, 30, "process spans covering every subtask")
    assert sum(s["attributes"]["messaging.batch.message_count"] for s in spans) == 20
    for s in spans:
        assert s["kind"] == CONSUMER and s["service"] == "worker-svc"
        assert s["attributes"]["queueworks.task.id"] == task.id
        assert (s["trace_id"], s["parent"]) == (send["trace_id"], send["span_id"])
    ones = [s for s in receiver.find(f"process {name}") if s not in spans]
    if not each:
        assert ones == []
        return
    ones = wait_for(
        lambda: (
            len(receiver.find(f"process {name}")) >= len(spans) + 20
            and [s for s in receiver.find(f"process {name}") if s not in spans]
        ),
        30,
        "a span per subtask",
    )
    assert sorted(int(s["attributes"]["messaging.message.id"]) for s in ones) == list(range(20))
    batch_ids = {s["span_id"] for s in spans}
    assert all(s["parent"] in batch_ids and s["trace_id"] == send["trace_id"] for s in ones)


# a worker where importing OpenTelemetry fails, as where the otel extra is not installed
NO_OTEL = """
import sys
def importer():
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen") or "importlib" in frame.f_code.co_filename
    ):
        frame = frame.f_back
    return "" if frame is None else frame.f_globals.get("__name__", "")
class NoOtel:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("opentelemetry", "wrapt"):
            by = importer()
            if not by.startswith("redis"):  # (redis-py's own metrics try it: not ours)
                print(f"otel import tried: {name} by {by}", file=sys.stderr, flush=True)
            raise ImportError(f"no module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, NoOtel())
sys.argv[0] = "queueworks"
from queueworks.cli import main
main()
"""


@pytest.mark.system
def test_a_worker_without_opentelemetry_runs_jobs_as_today(
    cluster: Cluster, client: Client, r: redis.Redis, tmp_path: Path
) -> None:
    """OpenTelemetry cannot be imported: a worker runs jobs and logs each job's lines (the
    job, its queue and attempt; no trace), JSON by default where stderr is no terminal, and
    never tries to import it (nor wrapt), even where it would be found; ``--otel`` there is
    one clear line and exit 2."""
    env = {k: v for k, v in cluster.env.items() if k != "QUEUEWORKS_LOG_FORMAT"}
    name = f"plain-{uuid.uuid4().hex[:6]}"
    argv = [sys.executable, "-c", NO_OTEL, "worker", "--name", name, "--allow", ALLOW]
    refused = subprocess.run(
        [*argv, "--otel"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2, refused.stderr
    assert "--otel needs the otel extra" in refused.stderr
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=out, stderr=out)
    try:
        cluster.wait_workers(r, 1)
        q = client.queue(f"q-{name}")
        jobs = [q.enqueue("tests.handlers_otel:plain", i) for i in range(3)]
        assert [j.result(timeout=30) for j in jobs] == [0, 2, 4]
    finally:
        worker.terminate()
        worker.wait(20)
    text = log.read_text()
    assert worker.returncode == 0, text
    assert "Traceback" not in text and "otel import tried" not in text
    done = {e["job_id"]: e for e in log_events(text, "job_done")}
    assert set(done) == {j.id for j in jobs}
    assert all(e["queue"] == f"q-{name}" and e["attempt"] == 1 for e in done.values())
    assert not any("trace_id" in e for e in done.values())
    said = log_events(text, "handler_said")
    assert {e["job_id"] for e in said} == {j.id for j in jobs}


@pytest.mark.unit
def test_queueworks_and_its_worker_import_nothing_of_opentelemetry() -> None:
    """Tracing off: importing queueworks, its client, CLI and worker, and setting up its
    logs, never tries to import OpenTelemetry (nor wrapt); redis-py 8's own metrics try,
    which is not ours (the attempts are blocked, so that none is hidden by a module that
    redis-py loaded first)."""
    code = NO_OTEL.split("sys.argv[0]")[0] + (
        "import queueworks, queueworks.cli, queueworks.workers.worker, queueworks.client.aio\n"
        "from queueworks.logs import configure\n"
        "configure()\n"
        "print('imported')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "imported" and "otel import tried" not in out.stderr


@pytest.mark.system
def test_log_level_warning_leaves_out_the_job_lines(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    w = cluster.worker(allow=(ALLOW,), extra=["--log-level", "warning"])
    cluster.wait_workers(r, 1)
    q = client.queue(f"quiet-{uuid.uuid4().hex[:6]}")
    assert q.enqueue("tests.handlers_otel:plain", 4).result(timeout=30) == 8
    for event in ("job_started", "job_done", "handler_said"):
        assert f'"{event}"' not in w.log()


@pytest.mark.unit
def test_a_traced_jobs_options_carry_its_context_beside_its_own() -> None:
    """The trace context is added to a job's own options (or makes them), and their
    reading (``JobOptions.parse``) ignores it; a deferred job's marks a link."""
    from opentelemetry.sdk.trace import TracerProvider

    from queueworks.otel import Producer, carried

    tracer = TracerProvider().get_tracer("t")
    producer = Producer()
    assert producer.carry("") == ""  # no span: nothing carried
    with tracer.start_as_current_span("s") as span:
        bare = producer.carry("")
        mine = producer.carry(JobOptions(group="g", retry_delay=2.0).json())
    ctx = span.get_span_context()
    tp = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert json.loads(bare) == {"tp": tp}
    assert json.loads(mine) == {"retry_delay": 2.0, "group": "g", "tp": tp}
    assert JobOptions.parse(mine) == JobOptions(group="g", retry_delay=2.0)
    assert JobOptions.parse(bare) == JobOptions()
    assert carried(mine) == ({"traceparent": tp}, False)
    assert carried(producer.as_link(mine)) == ({"traceparent": tp}, True)
    assert producer.as_link("") == "" and carried("{not json") == ({}, False)


@pytest.mark.unit
def test_tracestate_and_baggage_ride_with_the_job_and_come_back() -> None:
    """A context with a ``tracestate`` and baggage: both carried (as the W3C headers), and
    the worker's side reads them back with the producer's span as the remote parent."""
    from opentelemetry import baggage, context, trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    from queueworks.otel import Producer, carried, remote

    state = TraceState([("vendor", "v1")])
    parent = SpanContext(0xABC, 0xDEF, True, TraceFlags(1), state)
    ctx = trace.set_span_in_context(NonRecordingSpan(parent))
    ctx = baggage.set_baggage("tenant", "t 7", ctx)
    token = context.attach(ctx)
    try:
        with TracerProvider().get_tracer("t").start_as_current_span("send") as span:
            options = Producer().carry('{"group":"g"}')
    finally:
        context.detach(token)
    found = json.loads(options)
    assert found["group"] == "g" and found["ts"] == "vendor=v1"
    assert found["bg"] == "tenant=t+7"
    headers, link = carried(options)
    assert set(headers) == {"traceparent", "tracestate", "baggage"} and not link
    back = remote(headers)
    sent = span.get_span_context()
    got = trace.get_current_span(back).get_span_context()
    assert (got.trace_id, got.span_id, got.is_remote) == (sent.trace_id, sent.span_id, True)
    assert got.trace_state == state
    assert baggage.get_baggage("tenant", back) == "t 7"


@pytest.mark.system
def test_a_worker_on_a_terminal_logs_for_the_console(
    cluster: Cluster, client: Client, r: redis.Redis
) -> None:
    """No ``--log-format``, stderr a terminal (a pseudo-terminal here): the worker's lines
    are for the console, not JSON, and its job lines still name the job."""
    import os
    import pty
    import select

    env = {k: v for k, v in cluster.env.items() if k != "QUEUEWORKS_LOG_FORMAT"}
    name = f"tty-{uuid.uuid4().hex[:6]}"
    argv = [sys.executable, "-m", "queueworks", "worker", "--name", name, "--allow", ALLOW]
    main, tty = pty.openpty()
    worker = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=tty, stderr=tty)
    os.close(tty)
    seen = b""
    try:
        cluster.wait_workers(r, 1)
        job = client.queue(f"q-{name}").enqueue("tests.handlers_otel:plain", 5)
        assert job.result(timeout=30) == 10

        def read_done() -> bool:
            nonlocal seen
            while select.select([main], [], [], 0.1)[0]:
                seen += os.read(main, 65536)
            return job.id.encode() in seen and b"job_done" in seen

        wait_for(read_done, 30, "the worker's job_done line on its terminal")
    finally:
        worker.terminate()
        worker.wait(20)
        os.close(main)
    lines = [line for line in seen.decode().splitlines() if "job_done" in line]
    assert lines and not any(line.lstrip().startswith("{") for line in lines)
    assert f"job_id={job.id}" in lines[0] and f"queue=q-{name}" in lines[0]


@pytest.mark.unit
def test_the_log_format_follows_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    assert default_format() == "json"  # pytest's stderr is no terminal
    monkeypatch.setattr(sys, "stderr", Tty())
    assert default_format() == "console"


@pytest.mark.unit
def test_the_instrumentor_is_registered_for_opentelemetry_instrument() -> None:
    """``opentelemetry-instrument`` finds it by its entry point (where the package is
    installed from this tree's pyproject.toml)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    points = project["entry-points"]["opentelemetry_instrumentor"]
    assert points == {"queueworks": "queueworks.otel:QueueworksInstrumentor"}
    assert "opentelemetry-api" in " ".join(project["optional-dependencies"]["otel"])
