"""asyncio, side by side in one run (issue 20): queueworks' ``AsyncClient`` and async workers
against arq, saq and streaq, no-op jobs enqueued one awaited call each.

    python -m bench.asyncpeers                 # 3 rounds (~5 min on 2 cores, venvs included)
    python -m bench.asyncpeers --quick         # tiny sizes, one round, jobs counted (CI)
    python -m bench.asyncpeers --repeat 5 --only queueworks-async,saq --producers 50

The workload (``bench.peers.harness.async_throughput``): ``--n`` jobs, each enqueued by one
awaited call of the system's asyncio client (queueworks ``await q.enqueue(...)``, arq
``await pool.enqueue_job(...)``, saq ``await queue.enqueue(...)``, streaq ``await
task.enqueue(...)``) from P coroutines of one process, each awaiting its call before making
the next: P = 50 (concurrent producers, as the requests of an async web app) and P = 1 (one
coroutine, every call returning before the next); 2 worker processes running an ``async
def`` no-op with ``--concurrency`` jobs in flight each (queueworks ``worker --concurrency``,
arq ``max_jobs``, saq ``concurrency``, streaq ``concurrency``): the same allowance for all.
Workers booted and warm; jobs/s from the first enqueue call to the last job done, capped at
``budget_s`` (then the jobs done by then over the time taken). The CPU time each side used
(the producer's process, the worker processes, redis-server) is recorded with it.

Beside them, not a peer: the *raw limit* (``bench.peers.peer_raw``): one awaited ``XADD``
per job from redis-py's asyncio client, 2 plain consumers; what one call per job costs at
least, whatever the queue.

Each system runs in its own driver process (``bench.peers.driver``, in the peer's venv, from
a snapshot of the code) against one private redis-server, emptied between runs; the
systems' order is reversed every other round, and a ratio is the median over rounds of the
ratio within a round. Writes ``bench/asyncpeers_results.json`` and prints the table for
BENCHMARKS.md; ``--report`` prints it again from the results without measuring.
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

from bench.peers import run as peers
from bench.peers.run import DriverRun, System
from bench.peers.venvs import DEFAULT_DIR
from bench.queue import Bench, _spread, finish, paired
from queueworks.contrib.redis_server import RedisServer

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out" / "asyncpeers"
RESULTS = ROOT / "bench" / "asyncpeers_results.json"
QW, RAW = "queueworks-async", "raw"
PEERS = ("arq", "saq", "streaq")
SYSTEMS = (
    System(QW, "queueworks (AsyncClient, worker --concurrency)", None),
    System("arq", "arq", "arq"),
    System("saq", "saq", "saq"),
    System("streaq", "streaq", "streaq"),
    System(RAW, "raw limit: one awaited XADD per job (not a peer)", None),
)
TARGET = 5.0  # issue 20: >= 5x the best of arq, saq and streaq

FULL = {
    "n": 20_000,
    "workers": 2,
    "concurrency": 50,
    "producers": [50, 1],
    "budget_s": 15.0,
    "repeat": 3,
    "count": False,
}
QUICK = {
    "n": 300,
    "workers": 2,
    "concurrency": 10,
    "producers": [10],
    "budget_s": 30.0,
    "repeat": 1,
    "count": True,
}


def mode(producers: int) -> str:
    """The results' name of a run with ``producers`` producer coroutines."""
    return f"producers_{producers}"


def plan(
    p: dict[str, Any], keys: Sequence[str], round_no: int
) -> list[tuple[str, str, dict[str, Any]]]:
    """(system, mode, params) of one round in run order: for each number of producers,
    every system, their order reversed every other round."""
    keys = list(keys) if round_no % 2 == 0 else list(reversed(keys))
    wl = {k: p[k] for k in ("n", "workers", "concurrency", "count")}
    return [
        (k, mode(n), {**wl, "producers": n, "budget": p["budget_s"]})
        for n in p["producers"]
        for k in keys
    ]


def best_peer(doc: dict[str, Any], name: str) -> tuple[str | None, float | None]:
    """The peer with the highest median rate in mode ``name``, and queueworks' median ratio
    to the best peer over the rounds (each round's ratio to that round's best peer)."""
    results = doc["results"]
    ours_runs = results.get(QW, {}).get(name, [])
    ratios = []
    for i, ours in enumerate(ours_runs):
        theirs = [
            float(runs[i]["jobs_per_s"])
            for key in PEERS
            if i < len(runs := results.get(key, {}).get(name, [])) and "error" not in runs[i]
        ]
        if "error" not in ours and theirs and max(theirs) > 0:
            ratios.append(float(ours["jobs_per_s"]) / max(theirs))
    medians = {
        key: statistics.median(float(r["jobs_per_s"]) for r in ok)
        for key in PEERS
        if (ok := [r for r in results.get(key, {}).get(name, []) if "error" not in r])
    }
    best = max(medians, key=lambda k: medians[k]) if medians else None
    return best, statistics.median(ratios) if ratios else None


def cpu_per_job(runs: list[dict[str, Any]]) -> str:
    """Median µs of CPU per job: the producer's process / the workers / redis-server."""
    ok = [r for r in runs if "error" not in r and r.get("done") and "cpu_seconds" in r]
    if not ok:
        return "-"
    parts = [
        statistics.median(r["cpu_seconds"][side] / r["done"] * 1e6 for r in ok)
        for side in ("producer", "workers", "redis")
    ]
    return " / ".join(f"{v:,.0f}" for v in parts)


def markdown(doc: dict[str, Any]) -> str:
    p, labels = doc["params"], {k: v["label"] for k, v in doc["systems"].items()}
    loads = [r["load_1m"] for per in doc["results"].values() for rs in per.values() for r in rs]
    out = [
        f"{doc['date']}, `{doc['command']}` ({doc['duration_s'] / 60:.1f} min;"
        f" {p['repeat']} round(s), median (min to max); load average (1 min) when each run"
        f" started: {min(loads, default=0):.1f} to {max(loads, default=0):.1f}):\n",
    ]
    targets = []
    for producers in p["producers"]:
        name = mode(producers)
        out += [
            f"{p['n']:,} `async def` no-op jobs, each by one awaited enqueue call from"
            f" **{producers} producer coroutine(s)** in one process; {p['workers']} worker"
            f" processes, {p['concurrency']} jobs in flight each (capped at"
            f" {p['budget_s']:.0f} s: *); first enqueue to last done.\n",
            "| system | version | jobs/s | enqueueing (s) | CPU µs per job: producer /"
            " workers / redis | queueworks ÷ system |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for key, per in doc["results"].items():
            runs = per.get(name, [])
            if not runs:
                continue
            cell = _spread(doc, key, name, "jobs_per_s", 0)
            ok = [r for r in runs if "error" not in r]
            if any(r.get("capped") for r in ok):
                cell += "*"
            enq = statistics.median(r["enqueue_seconds"] for r in ok) if ok else None
            vs = paired(doc, QW, key, name, "jobs_per_s") if key != QW else None
            info = doc["systems"][key]
            version = info["versions"].get(info["package"], "?") if key != RAW else ""
            out.append(
                f"| {labels[key]} | {version} | {cell} |"
                f" {'-' if enq is None else f'{enq:.2f}'} | {cpu_per_job(runs)} |"
                f" {'' if vs is None else f'{vs:,.2f}x'} |"
            )
        out.append("")
        best, ratio = best_peer(doc, name)
        met = "-" if ratio is None else "yes" if ratio >= TARGET else "**no**"
        shown = "-" if ratio is None else f"{ratio:.2f}x"
        best_label = labels[best] if best else "none"
        targets.append(
            f"| ≥ {TARGET:.0f}x the best of arq, saq and streaq, {producers} producer(s)"
            f" ({best_label} here) | {shown} | {met} |"
        )
    out += ["| target (issue 20) | this run | met |", "| --- | ---: | --- |", *targets]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one round, jobs counted")
    ap.add_argument("--only", default="", help="comma-separated systems (default: all)")
    ap.add_argument("--repeat", type=int, default=None, help="rounds (default 3; quick 1)")
    for name in ("n", "concurrency"):
        ap.add_argument(f"--{name}", type=int, default=None, help=f"default {FULL[name]}")
    ap.add_argument("--producers", default="", help="comma-separated counts (default 50,1)")
    ap.add_argument("--venvs", type=Path, default=DEFAULT_DIR, help="where the peers' venvs live")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--report", action="store_true", help="print the table of --results")
    args = ap.parse_args(argv)
    if args.report:
        doc = json.loads(args.results.read_text())
        print(markdown(doc))
        return doc
    started = time.monotonic()
    params = dict(QUICK if args.quick else FULL)
    for name in ("repeat", "n", "concurrency"):
        if getattr(args, name) is not None:
            params[name] = max(1, getattr(args, name))
    if args.producers:
        params["producers"] = [max(1, int(n)) for n in args.producers.split(",")]
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - {s.key for s in SYSTEMS}
    if unknown:
        raise SystemExit(f"--only: unknown system(s) {', '.join(sorted(unknown))}")
    chosen = [s for s in SYSTEMS if not only or s.key in only]
    doc: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.asyncpeers"
        + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv)),
        "params": params,
        "machine": peers.machine(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
    }
    workdir = Path(tempfile.mkdtemp(prefix="qw-asyncpeers-"))
    DriverRun.src = peers.snapshot(workdir / "src")
    DriverRun.logs = OUT
    shutil.rmtree(OUT, ignore_errors=True)
    try:
        bench = Bench(chosen, args.venvs)
        with RedisServer() as server:
            server.start()
            for round_no in range(params["repeat"]):
                peers.say(f"round {round_no + 1} of {params['repeat']}")
                for key, name, wl in plan(params, [s.key for s in chosen], round_no):
                    timeout = params["budget_s"] + 120
                    bench.run(server, key, "async_throughput", wl, timeout, round_no, name)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    finish(doc, bench, args.results, started)
    print()
    print(markdown(doc))
    return doc


if __name__ == "__main__":
    main()
