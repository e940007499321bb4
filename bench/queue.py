"""Queues (issue 18), side by side in one run: jobs enqueued one call at a time.

    python -m bench.queue                  # 3 rounds (~8 min on 2 cores, venvs included)
    python -m bench.queue --quick          # tiny sizes, queueworks and the raw limit only
    python -m bench.queue --repeat 5 --only queueworks-queue,raw,rq-simple

Three measurements, each repeated ``--repeat`` times with the systems interleaved (their
order reversed every other round: a drifting load on a shared machine moves all of them),
reported as medians, and ratios as the median over rounds of the ratio within a round:

1. **One call per job**: 1 producer calling its system's one-job enqueue once per job (each
   call returns before the next), 2 worker processes, no-op jobs; jobs/s from the first
   enqueue to the last job done (``bench.peers.harness.throughput(each=True)``). The *raw
   limit* is ``bench.peers.peer_raw``: one ``XADD`` round trip per job, 2 plain consumers
   blocked in ``XREADGROUP``.
2. **Latency**: one job every 1/50 s on an idle queue, 1 worker process; a sample is the
   handler's start minus the producer's send time (``harness.latency``).
3. **enqueue_many**: ``q.enqueue_many`` of no-op jobs, no workers (``harness.enqueue``).
4. **CPU per job** (``bench.job_cpu``, ``--cpu-rounds``): producer, redis-server and the 2
   workers pinned to one core, their CPU time from ``/proc`` per job, beside the floor of a
   bare-RESP producer and 2 consumers that store each result (``bench.resp_floor``).

Every system runs in its own driver process (``bench.peers.driver``, in the peer's venv,
from a snapshot of the code) against **one** private redis-server, emptied between runs.
Writes ``bench/queue_results.json`` and prints the tables for BENCHMARKS.md (markdown),
with each target and whether this run met it; driver and worker logs go to
``bench/out/queue/``. ``python -m bench.queue --report`` prints the tables of the last run
again without measuring.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from bench import job_cpu
from bench.peers import run as peers
from bench.peers.run import SYSTEMS, DriverRun, System
from bench.peers.venvs import DEFAULT_DIR, VENVS, ensure
from queueworks.contrib.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
RESULTS = ROOT / "bench" / "queue_results.json"  # the figures BENCHMARKS.md quotes
QW, RAW, RQ = "queueworks-queue", "raw", "rq-simple"
RAW_SYSTEM = System(RAW, "raw limit: one XADD per job, 2 plain consumers", None)
PEERS = ("rq-simple", "rq", "dramatiq", "streaq", "arq", "celery")
LATENCY_SYSTEMS = (QW, RQ, RAW)
CPU_JOBS = 20_000  # jobs per run of the CPU-per-job measurement

FULL = {
    "each_n": 20_000,
    "each_budget_s": 20.0,
    "latency_rate": 50.0,
    "latency_count": 300,
    "many_n": 100_000,
    "repeat": 3,
}
QUICK = {
    "each_n": 300,
    "each_budget_s": 20.0,
    "latency_rate": 50.0,
    "latency_count": 20,
    "many_n": 5_000,
    "repeat": 1,
}

TARGETS = {  # issue 18, "Performance"
    "vs_rq": 10.0,  # one call per job: >= 10x RQ SimpleWorker
    "vs_raw": 0.7,  # >= 0.7x the raw limit
    "p50_vs_rq": 0.5,  # latency p50 <= 0.5x RQ's
    "p99_vs_rq": 1.0,  # latency p99 <= RQ's
    "many": 100_000.0,  # enqueue_many jobs/s
}


def systems(only: set[str]) -> list[System]:
    known = {s.key: s for s in (*SYSTEMS, RAW_SYSTEM)}
    keys = [QW, RAW, *PEERS]
    if only:
        unknown = only - set(keys)
        if unknown:
            raise SystemExit(f"--only: unknown system(s) {', '.join(sorted(unknown))}")
        keys = [k for k in keys if k in only]
    return [known[k] for k in keys]


def plan(
    p: dict[str, Any], keys: Sequence[str], round_no: int = 0
) -> list[tuple[str, str, dict[str, Any], float]]:
    """(system, workload, params, timeout) of one round, in run order: the systems' order is
    reversed every other round, so a drifting load favours none of them."""
    keys = list(keys) if round_no % 2 == 0 else list(reversed(keys))
    each = {"n": p["each_n"], "workers": 2, "budget": p["each_budget_s"], "each": True}
    latency = {"rate": p["latency_rate"], "count": p["latency_count"], "workers": 1}
    lat_timeout = p["latency_count"] / p["latency_rate"] + 300
    out = [(k, "throughput", each, p["each_budget_s"] + 300) for k in keys]
    out += [(k, "latency", latency, lat_timeout) for k in keys if k in LATENCY_SYSTEMS]
    if QW in keys:
        out.append((QW, "enqueue", {"n": p["many_n"]}, 600))
    return out


class Bench:
    """One run: the venvs, one redis-server, and the results of every round."""

    def __init__(self, chosen: list[System], venvs: Path) -> None:
        self.systems = {s.key: s for s in chosen}
        self.pythons: dict[str, str] = {}
        self.info: dict[str, Any] = {}
        for system in chosen:
            entry: dict[str, Any] = {"label": system.label}
            if system.venv is None:
                self.pythons[system.key] = sys.executable
                entry.update(versions=peers.queueworks_versions(), package="queueworks")
            else:
                built = ensure(VENVS[system.venv], venvs)
                entry.update(package=built.spec.package, versions=built.versions)
                if built.python is None:
                    entry["error"] = f"venv could not be built: {built.error}"
                    peers.say(system.key, "cannot run:", built.error.splitlines()[0])
                else:
                    self.pythons[system.key] = str(built.python)
            self.info[system.key] = entry
        self.results: dict[str, dict[str, list[dict[str, Any]]]] = {}

    def run(
        self,
        server: RedisServer,
        key: str,
        workload: str,
        params: dict[str, Any],
        timeout: float,
        round_no: int,
        label: str | None = None,
    ) -> None:
        """One run of ``workload``; its result is kept under ``label`` (default: the
        workload's name)."""
        if key not in self.pythons:
            return
        redis.Redis.from_url(server.url).flushall()  # our private server: empty per run
        label = label or workload
        name = f"{label}.{round_no}"
        peers.say(f"{key}: {workload} {json.dumps(params)}")
        driver = DriverRun(self.pythons[key], self.systems[key], workload, params, name, server)
        result = driver.finish(timeout)
        self.results.setdefault(key, {}).setdefault(label, []).append(result)
        peers.say("   ->", summary(workload, result))


def summary(workload: str, r: dict[str, Any]) -> str:
    if "error" in r:
        return f"failed: {r['error']}"
    if workload == "throughput":
        capped = f" (capped: {r['done']:,} of {r['jobs']:,})" if r["capped"] else ""
        return f"{r['jobs_per_s']:,.0f} jobs/s{capped}, load {r['load_1m']:.1f}"
    if workload == "latency":
        return f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, load {r['load_1m']:.1f}"
    return f"{r['jobs_per_s']:,.0f} jobs/s, load {r['load_1m']:.1f}"


# -- the figures ---------------------------------------------------------------------------


def _ok(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if "error" not in r]


def median_of(doc: dict[str, Any], key: str, workload: str, field: str) -> float | None:
    runs = _ok(doc["results"].get(key, {}).get(workload, []))
    return statistics.median(float(r[field]) for r in runs) if runs else None


def paired(doc: dict[str, Any], a: str, b: str, workload: str, field: str) -> float | None:
    """Median over rounds of a's value / b's value in the same round."""
    ra = doc["results"].get(a, {}).get(workload, [])
    rb = doc["results"].get(b, {}).get(workload, [])
    ratios = [
        float(x[field]) / float(y[field])
        for x, y in zip(ra, rb, strict=False)
        if "error" not in x and "error" not in y and float(y[field]) > 0
    ]
    return statistics.median(ratios) if ratios else None


def targets(doc: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met?) for each of the issue's targets this run could check."""
    out: list[tuple[str, str, bool | None]] = []

    def ratio(text: str, value: float | None, met: Any) -> None:
        out.append(
            (
                text,
                "-" if value is None else f"{value:.2f}x",
                None if value is None else bool(met(value)),
            )
        )

    ratio(
        "one call per job >= 10x RQ SimpleWorker",
        paired(doc, QW, RQ, "throughput", "jobs_per_s"),
        lambda v: v >= TARGETS["vs_rq"],
    )
    ratio(
        "one call per job >= 0.7x the raw limit",
        paired(doc, QW, RAW, "throughput", "jobs_per_s"),
        lambda v: v >= TARGETS["vs_raw"],
    )
    for key in PEERS:
        if key != RQ and key in doc["results"]:
            label = doc["systems"][key]["label"]
            vs = paired(doc, QW, key, "throughput", "jobs_per_s")
            ratio(f"one call per job ahead of {label}", vs, lambda v: v > 1.0)
    ratio(
        "latency p50 <= 0.5x RQ SimpleWorker's",
        paired(doc, QW, RQ, "latency", "p50_ms"),
        lambda v: v <= TARGETS["p50_vs_rq"],
    )
    ratio(
        "latency p99 <= RQ SimpleWorker's",
        paired(doc, QW, RQ, "latency", "p99_ms"),
        lambda v: v <= TARGETS["p99_vs_rq"],
    )
    many = median_of(doc, QW, "enqueue", "jobs_per_s")
    out.append(
        (
            "enqueue_many >= 100,000 jobs/s",
            "-" if many is None else f"{many:,.0f}/s",
            None if many is None else many >= TARGETS["many"],
        )
    )
    return out


def _spread(doc: dict[str, Any], key: str, workload: str, field: str, digits: int) -> str:
    runs = _ok(doc["results"].get(key, {}).get(workload, []))
    if not runs:
        failed = doc["results"].get(key, {}).get(workload, [])
        return f"failed: {failed[0]['error']}" if failed else "-"
    values = sorted(float(r[field]) for r in runs)
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:,.{digits}f}"
    return f"**{med:,.{digits}f}** ({values[0]:,.{digits}f} to {values[-1]:,.{digits}f})"


def markdown(doc: dict[str, Any]) -> str:
    p, labels = doc["params"], {k: v["label"] for k, v in doc["systems"].items()}
    loads = [
        r["load_1m"]
        for per in doc["results"].values()
        for runs in per.values()
        for r in runs
        if "load_1m" in r
    ]
    out = [
        f"{doc['date']}, `{doc['command']}` ({doc['duration_s'] / 60:.1f} min;"
        f" {p['repeat']} round(s), median (min to max); load average (1 min) when each run"
        f" started: {min(loads, default=0):.1f} to {max(loads, default=0):.1f},"
        f" median {statistics.median(loads) if loads else 0:.1f}):\n",
        f"One call per job: {p['each_n']:,} no-op jobs, 1 producer, 2 worker processes"
        f" (capped at {p['each_budget_s']:.0f} s: *), first enqueue to last done.\n",
        "| system | jobs/s | queueworks queue ÷ system (median of rounds) |",
        "| --- | ---: | ---: |",
    ]
    for key in doc["results"]:
        if "throughput" not in doc["results"][key]:
            continue
        cell = _spread(doc, key, "throughput", "jobs_per_s", 0)
        if any(r.get("capped") for r in _ok(doc["results"][key]["throughput"])):
            cell += "*"
        vs = paired(doc, QW, key, "throughput", "jobs_per_s") if key != QW else None
        out.append(f"| {labels[key]} | {cell} | {'' if vs is None else f'{vs:,.2f}x'} |")
    out.append(
        f"\nEnqueue → handler start at {p['latency_rate']:.0f} jobs/s, {p['latency_count']}"
        " jobs, 1 worker process, idle queue:\n"
    )
    out.append("| system | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |")
    out.append("| --- | ---: | ---: | ---: | ---: |")
    for key in doc["results"]:
        if "latency" not in doc["results"][key]:
            continue
        cells = [
            _spread(doc, key, "latency", f, 2) for f in ("p50_ms", "p90_ms", "p99_ms", "max_ms")
        ]
        out.append(f"| {labels[key]} | {' | '.join(cells)} |")
    if QW in doc["results"] and "enqueue" in doc["results"][QW]:
        out.append(
            f"\n`q.enqueue_many` of {p['many_n']:,} no-op jobs, no workers:"
            f" {_spread(doc, QW, 'enqueue', 'jobs_per_s', 0)} jobs/s,"
            f" {_spread(doc, QW, 'enqueue', 'mb_per_100k', 1)} MB of Redis per 100k queued.\n"
        )
    if "cpu" in doc:
        cpu = doc["cpu"]
        out.append(
            "CPU per job (`bench.job_cpu`): 1 producer, 2 workers, redis-server, all pinned to"
            " one core; the floor is bare RESP (`bench.resp_floor`).\n"
        )
        out.append(job_cpu.table(cpu["runs"], cpu["jobs"], cpu["rounds"]) + "\n")
    out.append("| target (issue 18) | this run | met |")
    out.append("| --- | ---: | --- |")
    for text, value, met in targets(doc):
        out.append(f"| {text} | {value} | {'-' if met is None else 'yes' if met else '**no**'} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes, one round, queueworks and the raw limit only (no venvs)",
    )
    ap.add_argument("--only", default="", help="comma-separated systems (default: all)")
    ap.add_argument("--repeat", type=int, default=None, help="rounds (default 3; quick 1)")
    ap.add_argument("--venvs", type=Path, default=DEFAULT_DIR, help="where the peers' venvs live")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--report", action="store_true", help="print the tables of --results")
    ap.add_argument(
        "--cpu-rounds",
        type=int,
        default=None,
        help="rounds of CPU per job beside the floor (bench.job_cpu; default 5, quick 0)",
    )
    args = ap.parse_args(argv)
    if args.report:
        doc = json.loads(args.results.read_text())
        print(markdown(doc))
        return doc
    started = time.monotonic()
    params = dict(QUICK if args.quick else FULL)
    if args.repeat is not None:
        params["repeat"] = max(1, args.repeat)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    if args.quick and not only:
        only = {QW, RAW}
    chosen = systems(only)
    doc: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.queue"
        + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)),
        "params": params,
        "machine": peers.machine(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    workdir = Path(tempfile.mkdtemp(prefix="qw-queue-bench-"))
    DriverRun.src = peers.snapshot(workdir / "src")
    DriverRun.logs = OUT / "queue"
    shutil.rmtree(DriverRun.logs, ignore_errors=True)
    try:
        bench = Bench(chosen, args.venvs)
        with RedisServer() as server:
            server.start()
            for round_no in range(params["repeat"]):
                peers.say(f"round {round_no + 1} of {params['repeat']}")
                order = [s.key for s in chosen]
                for key, workload, wl, timeout in plan(params, order, round_no):
                    bench.run(server, key, workload, wl, timeout, round_no)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    cpu_rounds = args.cpu_rounds if args.cpu_rounds is not None else 0 if args.quick else 5
    if cpu_rounds > 0:
        peers.say(f"CPU per job: {cpu_rounds} rounds beside the floor")
        trees: dict[str, Path | None] = {"queueworks": ROOT, job_cpu.FLOOR: None}
        doc["cpu"] = {
            "jobs": CPU_JOBS,
            "rounds": cpu_rounds,
            "runs": job_cpu.measure(trees, CPU_JOBS, cpu_rounds, workers=2),
        }
    finish(doc, bench, args.results, started)
    print()
    print(markdown(doc))
    return doc


def finish(doc: dict[str, Any], bench: Bench, path: Path, started: float) -> None:
    """The runs' results, systems and the load at the end into ``doc``, written to ``path``."""
    doc.update(systems=bench.info, results=bench.results)
    doc["load_end"] = [round(x, 2) for x in os.getloadavg()]
    doc["duration_s"] = round(time.monotonic() - started, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    peers.say("wrote", path)


if __name__ == "__main__":
    main()
