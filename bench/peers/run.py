"""The one command: every workload on every system, one run, one machine.

    python -m bench.peers.run            # full run (~20 min on 2 cores, venvs included)
    python -m bench.peers.run --quick    # small sizes (~5 min)
    python -m bench.peers.run --only queueworks,celery --no-docs

Creates the peers' venvs (``venvs.py``), runs each workload in a fresh private
redis-server (``RedisServer``) through ``driver.py`` inside the peer's venv, and writes
``bench/peers/results.json``, ``docs/peers.md`` and ``docs/peers.png``. Worker and driver
logs go to ``bench/out/peers/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.peers import report
from bench.peers.driver import RESULT_PREFIX
from bench.peers.venvs import DEFAULT_DIR, VENVS, ensure
from queueworks.contrib.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("queueworks", "controller", "workers", "bench")  # what the snapshot holds
RESULTS = Path(__file__).resolve().parent / "results.json"
LOGS = ROOT / "bench" / "out" / "peers"


@dataclass(frozen=True)
class System:
    key: str  # driver name: bench.peers.peer_<module>[-variant]
    label: str
    venv: str | None  # None: the runner's own environment (queueworks)
    each: bool = False  # throughput with one enqueue call per job (else the bulk API)


SYSTEMS = (
    System("queueworks", "queueworks", None),
    System("queueworks-queue", "queueworks queue, one call per job", None, each=True),
    System("rq", "RQ (Worker, forking)", "rq"),
    System("rq-simple", "RQ (SimpleWorker)", "rq"),
    System("celery", "Celery (acks_late)", "celery"),
    System("dramatiq", "Dramatiq", "dramatiq"),
    System("arq", "arq", "arq"),
    System("streaq", "streaq", "streaq"),
)

FULL = {
    "throughput_n": 20_000,
    "throughput_budget_s": 120.0,
    "tasks_n": 2_000,
    "enqueue_n": 100_000,
    "latency_rate": 20.0,
    "latency_count": 300,
    "give_up_s": 180.0,
}
QUICK = {
    "throughput_n": 2_000,
    "throughput_budget_s": 30.0,
    "tasks_n": 300,
    "enqueue_n": 10_000,
    "latency_rate": 20.0,
    "latency_count": 100,
    "give_up_s": 60.0,
}


def snapshot(dest: Path) -> Path:
    """Copy the code under test: other people edit this work tree while a run lasts, and one
    run must measure one version. Every driver and worker runs from the copy."""
    skip = shutil.ignore_patterns("__pycache__", ".venvs", "out", "results.json")
    for name in SOURCES:
        shutil.copytree(ROOT / name, dest / name, ignore=skip)
    return dest


class DriverRun:
    """One driver process against its own fresh redis-server, run from the snapshot."""

    src = ROOT
    logs = LOGS

    def __init__(
        self,
        python: str,
        system: System,
        workload: str,
        params: dict[str, Any],
        name: str,
        server: RedisServer | None = None,
    ) -> None:
        """``server``: a running one to use (the caller empties it between runs); by
        default a fresh one of its own, closed when the run finishes."""
        self.name = f"{system.key}.{name}"
        self.load = os.getloadavg()[0]
        self.own_server = server is None
        self.server = server or RedisServer().start()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.log = self.logs / f"{self.name}.driver.log"
        argv = [python, "-m", "bench.peers.driver", system.key, workload]
        argv += ["--url", self.server.url, "--logdir", str(self.logs)]
        argv += ["--params", json.dumps(params)]
        env = {**os.environ, "PYTHONPATH": str(self.src)}  # ahead of the editable install
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                argv, cwd=self.src, env=env, stdout=subprocess.PIPE, stderr=log, text=True
            )

    def finish(self, timeout: float) -> dict[str, Any]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            return self._failed(f"driver timed out after {timeout:.0f} s")
        finally:
            if self.own_server:
                self.server.close()
        lines = [ln for ln in out.splitlines() if ln.startswith(RESULT_PREFIX)]
        if self.proc.returncode != 0 or not lines:
            return self._failed(f"driver exited with code {self.proc.returncode}")
        result: dict[str, Any] = json.loads(lines[-1][len(RESULT_PREFIX) :])
        result["load_1m"] = round(self.load, 2)
        return result

    def _failed(self, why: str) -> dict[str, Any]:
        tail = self.log.read_text(errors="replace").strip().splitlines()[-6:]
        return {"error": why, "detail": "\n".join(tail), "load_1m": round(self.load, 2)}


def say(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    server = RedisServer()
    version = subprocess.run([server.binary, "--version"], capture_output=True, text=True).stdout
    server.close()
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 2**20, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "redis_server": version.split()[2].removeprefix("v=") if version else "unknown",
    }


def queueworks_versions() -> dict[str, str]:
    out = {}
    for dist in ("queueworks", "redis", "hiredis"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    git = ["git", "-C", str(ROOT)]
    rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if rev.returncode == 0:
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "queueworks", "controller", "workers"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        out["queueworks"] += f" ({rev.stdout.strip()}{' + uncommitted changes' if dirty else ''})"
    return out


def _plan(p: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], float]]:
    """(result name, workload, params, timeout) in run order; recovery is run separately."""
    n, budget = p["throughput_n"], p["throughput_budget_s"]
    return [
        ("throughput_1", "throughput", {"n": n, "workers": 1, "budget": budget}, budget + 300),
        ("throughput_2", "throughput", {"n": n, "workers": 2, "budget": budget}, budget + 300),
        ("enqueue", "enqueue", {"n": p["enqueue_n"]}, 900),
        (
            "latency",
            "latency",
            {"rate": p["latency_rate"], "count": p["latency_count"], "workers": 1},
            p["latency_count"] / p["latency_rate"] + 400,
        ),
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, ~5 minutes")
    ap.add_argument("--only", default="", help="comma-separated systems (default: all)")
    ap.add_argument("--venvs", type=Path, default=DEFAULT_DIR, help="where the venvs live")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--no-docs", action="store_true", help="write results.json only")
    args = ap.parse_args(argv)
    started = time.monotonic()
    params = dict(QUICK if args.quick else FULL)
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    systems = [s for s in SYSTEMS if not wanted or s.key in wanted]
    doc: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.peers.run"
        + "".join(f" {shlex.quote(a)}" for a in argv or sys.argv[1:]),
        "quick": args.quick,
        "params": params,
        "machine": machine(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "systems": {},
        "results": {},
    }

    shutil.rmtree(LOGS, ignore_errors=True)
    workdir = Path(tempfile.mkdtemp(prefix="qw-peers-"))
    DriverRun.src = snapshot(workdir / "src")
    say("venvs in", args.venvs, "- logs in", LOGS)
    pythons: dict[str, str] = {}
    for system in systems:
        info: dict[str, Any] = {"label": system.label}
        if system.venv is None:
            pythons[system.key] = sys.executable
            info.update(versions=queueworks_versions(), package="queueworks")
        else:
            built = ensure(VENVS[system.venv], args.venvs)
            info.update(package=built.spec.package, versions=built.versions)
            info["venv_seconds"] = round(built.seconds, 1)
            if built.python is None:
                info["error"] = f"venv could not be built: {built.error}"
                say(system.key, "cannot run:", built.error.splitlines()[0])
            else:
                pythons[system.key] = str(built.python)
        doc["systems"][system.key] = info
        doc["results"][system.key] = {}
        say(system.key, info["versions"].get(info["package"], "?"))

    chart_env = ensure(VENVS["report"], args.venvs)  # matplotlib, for docs/peers.png
    if chart_env.python is None:
        say("no chart: the report venv could not be built:", chart_env.error.splitlines()[0])

    runnable = [s for s in systems if s.key in pythons]
    for name, workload, wl_params, timeout in _plan(params):
        for system in runnable:
            each = system.each and workload == "throughput"
            params_of = {**wl_params, "each": True} if each else wl_params
            say(f"{system.key}: {name} {json.dumps(params_of)}")
            run = DriverRun(pythons[system.key], system, workload, params_of, name)
            result = run.finish(timeout)
            doc["results"][system.key][name] = result
            say("   ->", report.one_line(name, result))
        if name == "throughput_2" and "queueworks" in pythons:
            # queueworks used as a plain job queue: one task per job (shown beside, not ranked)
            as_jobs = System("queueworks-tasks", "queueworks, one task per job", None)
            wl = {"n": params["tasks_n"], "workers": 2, "budget": params["throughput_budget_s"]}
            say(f"queueworks, one task per job: throughput_2 {json.dumps(wl)}")
            run = DriverRun(sys.executable, as_jobs, "throughput", wl, "throughput_2")
            result = run.finish(params["throughput_budget_s"] + 300)
            doc["results"]["queueworks"]["throughput_2_tasks"] = result
            say("   ->", report.one_line(name, result))

    # Recovery: queueworks alone (seconds), then the peers together (each waits up to
    # give_up_s on its own Redis, mostly idle), so the run stays within its half hour.
    give_up = {"give_up": params["give_up_s"]}
    first = [s for s in runnable if s.venv is None]
    for batch in (first, [s for s in runnable if s.venv is not None]):
        if not batch:
            continue
        say(
            "recovery:", ", ".join(s.key for s in batch), f"(give up at {give_up['give_up']:.0f} s)"
        )
        runs = [(s, DriverRun(pythons[s.key], s, "recovery", give_up, "recovery")) for s in batch]
        for system, run in runs:
            doc["results"][system.key]["recovery"] = result = run.finish(params["give_up_s"] + 300)
            say(f"   {system.key} ->", report.one_line("recovery", result))

    doc["load_end"] = [round(x, 2) for x in os.getloadavg()]
    doc["duration_s"] = round(time.monotonic() - started, 1)
    args.results.write_text(json.dumps(doc, indent=2) + "\n")
    say("wrote", args.results)
    if not args.no_docs:
        for path in report.write(doc, args.results, chart_env.python):
            say("wrote", path)
    shutil.rmtree(workdir, ignore_errors=True)
    say(f"done in {doc['duration_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
