"""CPU per job of the plain job path beside its floor (and a git revision's, if asked).

    python -m bench.job_cpu                               # 20,000 jobs, 5 rounds (~1 min)
    python -m bench.job_cpu --against REV --jobs 5000 --rounds 3
    python -m bench.job_cpu --typed                       # and a typed no-op job (@job)
    python -m bench.job_cpu --otel                        # and with tracing on, beside it
    python -m bench.job_cpu --concurrency 4               # workers with --concurrency 4

Each round runs every system in turn (their order reversed every other round), each on a
fresh private redis-server: 2 workers (``queueworks worker``) and 1 producer that calls
``q.enqueue(noop)`` once per job, then waits until the queue counts them all done. The
*floor* is ``bench.resp_floor``: a producer writing one ``XADD`` per job in RESP by hand on
a bare socket, and 2 consumers that read in batches and store each job's result. Every
process is pinned to one core (``taskset -c 0``; ``BENCH_CORE=1``: core 1), so the time a
job takes is the CPU it costs: the producer's, redis-server's and the workers' CPU time
(from ``/proc``) over the run, divided by the jobs. The figures are the medians over
rounds, and each ratio the median of the per-round ratios. ``REV``'s code is checked out
with ``git archive``.
``--typed`` adds *queueworks typed*: the producer calls ``q.enqueue(typed_noop.call(i))``,
a typed job function of one ``int`` argument (``queueworks.examples``), in the same rounds.

``--otel`` adds *queueworks+otel*: this tree with tracing on (the ``otel`` extra): the
producer instrumented (``QueueworksInstrumentor``, the SDK with a batch span processor and
the OTLP/HTTP exporter), the workers started with ``--otel``; both export to a receiver in
this process (not pinned, not counted) that counts the spans it is sent: the workers' CPU
is read once every span has come (a run that lost some says so), the producer's after its
spans are flushed, so that their export is counted. And *SDK alone*: one pinned process
that makes, per job, the two spans a traced job has (``send`` and its child ``process``,
their names and attributes), with the same SDK, processor and exporter, and nothing else:
the SDK's own cost per job, which no instrumentation goes under. Its ratio row is
(queueworks + SDK alone) ÷ queueworks: the floor of queueworks+otel ÷ queueworks. *SDK
alone, not exported*: the same spans made and ended, with no span processor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from bench.common import ROOT
from queueworks.contrib.redis_server import RedisServer

CORE = os.environ.get("BENCH_CORE", "0")  # the core every process is pinned to
ALLOW = "queueworks.examples"
PRODUCER = r"""
import os, sys, time
from queueworks import Client
if os.environ.get("BENCH_OTEL"):  # the producer traced: the SDK, a batch processor, OTLP
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from queueworks.otel import QueueworksInstrumentor
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    QueueworksInstrumentor().instrument(tracer_provider=provider)
client = Client.from_url(sys.argv[1], prefix="qw")
q = client.queue("cpu")
n, members, typed = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "typed"
deadline = time.time() + 30
while len(q.status().nodes) < members and time.time() < deadline:  # the workers are in
    time.sleep(0.05)
print("go", flush=True)
sys.stdin.readline()
t0 = time.process_time()
if typed:
    from queueworks.examples import typed_noop
    for i in range(n):
        q.enqueue(typed_noop.call(i))
else:
    for i in range(n):
        q.enqueue("queueworks.examples:noop", i)
if os.environ.get("BENCH_OTEL"):  # every span exported, its cost counted
    provider.force_flush()
spent = time.process_time() - t0
deadline = time.time() + 120
while q.status().done < n and time.time() < deadline:
    time.sleep(0.01)
print("done", spent, q.status().done, flush=True)
if os.environ.get("BENCH_OTEL"):
    provider.shutdown()
"""


_PROCESSOR = (
    "provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), max_queue_size=2 * n + 1))"
)
# the SDK alone: per job, the spans a traced job has (queueworks.otel's names, attributes)
SDK_ALONE = r"""
import sys, time
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanKind
from queueworks import __version__
from queueworks.otel import SCHEMA_URL
n = int(sys.argv[1])
provider = TracerProvider()
provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), max_queue_size=2 * n + 1))
tracer = provider.get_tracer("queueworks.otel", __version__, schema_url=SCHEMA_URL)
system = {"messaging.system": "queueworks"}
t0 = time.process_time()
for i in range(n):
    send = tracer.start_span("send cpu", kind=SpanKind.PRODUCER, attributes={**system,
        "messaging.operation.name": "send", "messaging.operation.type": "send",
        "messaging.destination.name": "cpu"})
    job_id = f"1765000000000-{i}"
    send.set_attribute("messaging.message.id", job_id)
    send.end()
    remote = NonRecordingSpan(trace.SpanContext(
        send.get_span_context().trace_id, send.get_span_context().span_id, True,
        send.get_span_context().trace_flags))
    process = tracer.start_span("process cpu", context=trace.set_span_in_context(remote),
        kind=SpanKind.CONSUMER, attributes={**system, "messaging.operation.name": "process",
        "messaging.operation.type": "process", "messaging.destination.name": "cpu",
        "messaging.message.id": job_id, "messaging.client.id": "bench-w0",
        "queueworks.job.attempt": 1, "queueworks.job.handler": "queueworks.examples:noop"})
    process.end()
provider.shutdown()
print(time.process_time() - t0, flush=True)
"""


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), from ``/proc``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pinned(argv: list[str]) -> list[str]:
    return ["taskset", "-c", CORE, *argv]


def checkout(rev: str) -> Path:
    """``rev``'s tree in a temporary directory."""
    archive = subprocess.run(
        ["git", "archive", rev], cwd=ROOT, check=True, capture_output=True
    ).stdout
    where = Path(tempfile.mkdtemp(prefix="qw-job-cpu-"))
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where


FLOOR = "floor"
TYPED = "queueworks typed"
OTEL = "queueworks+otel"
SDK = "SDK alone"
SDK_BARE = "SDK alone, not exported"


class Sink:
    """An OTLP/HTTP receiver that counts the spans it is sent and answers 200 (``--otel``)."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        self.spans = 0
        lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                count = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                with lock:
                    sink.spans += count
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def env(self) -> dict[str, str]:
        """A process's variables to export here; a batch not full is sent after 0.2 s
        (not 5), so that the workers' last spans come within the measure."""
        return {
            "BENCH_OTEL": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        }

    def wait(self, spans: int, timeout: float = 10.0) -> int:
        """The spans received so far, once ``spans`` have been (or ``timeout`` s passed)."""
        deadline = time.monotonic() + timeout
        while self.spans < spans and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.spans


def sdk_alone(jobs: int, sink: Sink, exported: bool = True) -> dict[str, float]:
    """µs of CPU per job of the SDK alone making a traced job's two spans (``SDK_ALONE``);
    not ``exported``: made and ended only (no span processor)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **sink.env()}
    before = sink.spans
    code = SDK_ALONE if exported else SDK_ALONE.replace(_PROCESSOR, "")
    argv = pinned([sys.executable, "-c", code, str(jobs)])
    out = subprocess.run(argv, env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    got = sink.wait(before + 2 * jobs) - before
    if exported and got < 2 * jobs:
        print(f"SDK alone: {got} spans received of {2 * jobs}", file=sys.stderr)
    total = float(out.stdout.split()[-1]) * 1e6 / jobs
    return {"producer": 0.0, "redis": 0.0, "workers": 0.0, "total": total}


def spawn_workers(
    tree: Path | None,
    url: str,
    n: int,
    env: dict[str, str],
    otel: bool = False,
    concurrency: int = 1,
) -> list[Any]:
    """``n`` worker processes of ``tree``'s queueworks (None: the floor's consumers);
    ``otel``: started with ``--otel``; ``concurrency``: with ``--concurrency``."""
    if tree is None:
        argvs = [
            [sys.executable, "-m", "bench.resp_floor", "consume", url, f"c{i}"] for i in range(n)
        ]
        cwd, env = ROOT, {**env, "PYTHONPATH": str(ROOT)}
    else:
        argv = [sys.executable, "-m", "queueworks", "worker", "--allow", ALLOW]
        argv += ["--otel"] if otel else []
        argv += ["--concurrency", str(concurrency)] if concurrency > 1 else []
        argvs, cwd = [argv] * n, tree
        env = {**env, "QUEUEWORKS_REDIS_URL": url, "QUEUEWORKS_PREFIX": "qw"}
    return [
        subprocess.Popen(
            pinned(a), env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for a in argvs
    ]


def one_run(
    tree: Path | None,
    jobs: int,
    workers: int,
    typed: bool = False,
    sink: Sink | None = None,
    concurrency: int = 1,
) -> dict[str, float]:
    """µs of CPU per job of producer, redis-server and workers, for ``tree``'s code (None:
    the floor); ``typed``: of a typed job function's jobs; with tracing on, exported to
    ``sink``, if given."""
    env = {**os.environ, "PYTHONPATH": str(tree or ROOT), "QUEUEWORKS_LOG_LEVEL": "warning"}
    spans = 0
    if sink is not None:
        env.update(sink.env())
        spans = sink.spans
    with RedisServer() as server:
        pid = server.pid  # redis-server's
        subprocess.run(["taskset", "-pc", CORE, str(pid)], check=True, capture_output=True)
        url = server.url
        if tree is None:
            argv = [sys.executable, "-m", "bench.resp_floor", "produce", url, str(jobs)]
        else:
            kind = "typed" if typed else "plain"
            argv = [sys.executable, "-c", PRODUCER, url, str(jobs), str(workers), kind]
        producer = subprocess.Popen(
            pinned(argv),
            env=env,
            cwd=tree or ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs = spawn_workers(tree, url, workers, env, sink is not None, concurrency)
        try:
            assert producer.stdout is not None and producer.stdin is not None
            if producer.stdout.readline().strip() != "go":
                raise RuntimeError(f"{tree or FLOOR}: the producer did not start")
            time.sleep(0.5)  # the workers settle into their read loops
            before = [cpu_seconds(p) for p in (pid, *(w.pid for w in procs))]
            producer.stdin.write("\n")
            producer.stdin.flush()
            line = producer.stdout.readline().split()
            if sink is not None:  # each job's send and process span, the workers' exported
                got = sink.wait(spans + 2 * jobs) - spans
                if got < 2 * jobs:
                    print(f"{OTEL}: {got} spans received of {2 * jobs}", file=sys.stderr)
            after = [cpu_seconds(p) for p in (pid, *(w.pid for w in procs))]
            if len(line) != 3 or int(line[2]) < jobs:
                raise RuntimeError(f"{tree or FLOOR}: not every job was done: {line}")
        finally:
            for p in (producer, *procs):
                p.terminate()
                p.wait(10)
    per = 1e6 / jobs
    spent = [b - a for a, b in zip(before, after, strict=True)]
    out = {
        "producer": float(line[1]) * per,
        "redis": spent[0] * per,
        "workers": sum(spent[1:]) * per,
    }
    out["total"] = sum(out.values())
    return out


PARTS = ["producer", "redis", "workers", "total"]


def table(runs: dict[str, list[dict[str, float]]], jobs: int, rounds: int) -> str:
    """The medians per system, and each system's ratio to the floor (median per round)."""
    lines = [
        f"µs of CPU per job, {jobs} jobs, median of {rounds} rounds, one core\n",
        "| system | " + " | ".join(PARTS) + " |",
        "| --- |" + " ---: |" * len(PARTS),
    ]
    for name, rows in runs.items():
        cells = [f"{statistics.median(r[p] for r in rows):.1f}" for p in PARTS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, rows in runs.items():
        if name not in (FLOOR, SDK, SDK_BARE):
            lines.append(ratio_row(f"{name} ÷ floor", rows, runs[FLOOR]))
    for name in runs:  # --against REV: this tree beside it
        if name not in ("queueworks", FLOOR, TYPED, OTEL, SDK, SDK_BARE):
            lines.append(ratio_row(f"queueworks ÷ {name}", runs["queueworks"], runs[name]))
    if TYPED in runs:
        lines.append(ratio_row(f"{TYPED} ÷ queueworks", runs[TYPED], runs["queueworks"]))
    if OTEL in runs:
        base = runs["queueworks"]
        lines.append(ratio_row(f"{OTEL} ÷ queueworks", runs[OTEL], base))
        floor = statistics.median(
            (b["total"] + sdk["total"]) / b["total"] for b, sdk in zip(base, runs[SDK], strict=True)
        )
        lines.append(f"| (queueworks + {SDK}) ÷ queueworks |" + " |" * 3 + f" {floor:.2f}x |")
        bare = statistics.median(
            sdk["total"] / b["total"] for b, sdk in zip(base, runs[SDK_BARE], strict=True)
        )
        lines.append(f"| {SDK_BARE} ÷ queueworks |" + " |" * 3 + f" {bare:.2f}x |")
    return "\n".join(lines)


def ratio_row(title: str, rows: list[dict[str, float]], base: list[dict[str, float]]) -> str:
    """The median of the per-round ratios of ``rows`` to ``base``, part by part."""
    ratios = [
        f"{statistics.median(a[p] / b[p] for a, b in zip(rows, base, strict=True)):.2f}x"
        for p in PARTS
    ]
    return f"| {title} | " + " | ".join(ratios) + " |"


def measure(
    trees: dict[str, Path | None], jobs: int, rounds: int, workers: int, concurrency: int = 1
) -> dict[str, list[dict[str, float]]]:
    """``rounds`` runs of each system (None: the floor; ``OTEL``: this tree traced), their
    order reversed every other round: µs of CPU per job of each part, per run."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    sink = Sink() if OTEL in trees else None
    for k in range(rounds):
        order = list(trees) if k % 2 == 0 else list(reversed(trees))
        for name in order:
            if name in (SDK, SDK_BARE):
                assert sink is not None
                runs[name].append(sdk_alone(jobs, sink, exported=name == SDK))
            else:
                traced = sink if name == OTEL else None
                runs[name].append(
                    one_run(trees[name], jobs, workers, name == TYPED, traced, concurrency)
                )
            print(f"round {k + 1} {name}: {runs[name][-1]}", file=sys.stderr)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="a git revision to measure beside this tree")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1, help="each worker's --concurrency")
    parser.add_argument("--typed", action="store_true", help="and a typed no-op job (@job)")
    parser.add_argument("--otel", action="store_true", help="this tree traced, beside it")
    args = parser.parse_args()
    trees: dict[str, Path | None] = {"queueworks": ROOT, FLOOR: None}
    if args.typed:
        trees[TYPED] = ROOT
    if args.against:
        trees[args.against] = checkout(args.against)
    if args.otel:
        trees[OTEL] = trees[SDK] = trees[SDK_BARE] = ROOT
    runs = measure(trees, args.jobs, args.rounds, args.workers, args.concurrency)
    print(table(runs, args.jobs, args.rounds))


if __name__ == "__main__":
    main()
