"""CPU per job of the plain job path, this tree against a git revision, side by side.

    python -m bench.job_cpu --against REV                 # 20,000 jobs, 5 rounds
    python -m bench.job_cpu --against REV --jobs 5000 --rounds 3

Each round runs both trees, in turn (their order reversed every other round), each on a
fresh private redis-server: 1 worker (``queueworks worker``) and 1 producer that calls
``q.enqueue(noop)`` once per job, then waits until the queue counts them all done. Every
process is pinned to one core (``taskset -c 0``), so the time a job takes is the CPU it
costs: the producer's, redis-server's and the worker's CPU time (from ``/proc``) over the
run, divided by the jobs. The figures are the medians over rounds, and the ratio the
median of the per-round ratios. ``REV``'s code is checked out with ``git archive``.
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

from bench.common import ROOT
from queueworks.redis_server import RedisServer

CORE = "0"
ALLOW = "queueworks.examples"
PRODUCER = r"""
import sys, time
from queueworks import Client
client = Client.from_url(sys.argv[1], prefix="qw")
q = client.queue("cpu")
n = int(sys.argv[2])
deadline = time.time() + 30
while not q.status().nodes and time.time() < deadline:  # the worker is a member
    time.sleep(0.05)
print("go", flush=True)
sys.stdin.readline()
t0 = time.process_time()
for i in range(n):
    q.enqueue("queueworks.examples:noop", i)
spent = time.process_time() - t0
deadline = time.time() + 120
while q.status().done < n and time.time() < deadline:
    time.sleep(0.01)
print("done", spent, q.status().done, flush=True)
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


def one_run(tree: Path, jobs: int) -> dict[str, float]:
    """µs of CPU per job of producer, redis-server and worker, for ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree), "QUEUEWORKS_LOG_LEVEL": "warning"}
    with RedisServer() as server:
        pid = server.pid  # redis-server's
        subprocess.run(["taskset", "-pc", CORE, str(pid)], check=True, capture_output=True)
        url = server.url
        worker = subprocess.Popen(
            pinned(
                [sys.executable, "-m", "queueworks", "worker", "--allow", "queueworks.examples"]
            ),
            env={**env, "QUEUEWORKS_REDIS_URL": url, "QUEUEWORKS_PREFIX": "qw"},
            cwd=tree,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        producer = subprocess.Popen(
            pinned([sys.executable, "-c", PRODUCER, url, str(jobs)]),
            env=env,
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert producer.stdout is not None and producer.stdin is not None
            if producer.stdout.readline().strip() != "go":
                raise RuntimeError(f"{tree}: the producer did not start")
            time.sleep(0.5)  # the worker settles into its read loop
            before = cpu_seconds(pid), cpu_seconds(worker.pid)
            producer.stdin.write("\n")
            producer.stdin.flush()
            line = producer.stdout.readline().split()
            after = cpu_seconds(pid), cpu_seconds(worker.pid)
            if len(line) != 3 or int(line[2]) < jobs:
                raise RuntimeError(f"{tree}: not every job was done: {line}")
        finally:
            for p in (producer, worker):
                p.terminate()
                p.wait(10)
    per = 1e6 / jobs
    out = {
        "producer": float(line[1]) * per,
        "redis": (after[0] - before[0]) * per,
        "worker": (after[1] - before[1]) * per,
    }
    out["total"] = sum(out.values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision to compare with")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = {"this tree": ROOT, args.against: checkout(args.against)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for k in range(args.rounds):
        order = list(trees) if k % 2 == 0 else list(reversed(trees))
        for name in order:
            runs[name].append(one_run(trees[name], args.jobs))
            print(f"round {k + 1} {name}: {runs[name][-1]}", file=sys.stderr)
    parts = ["producer", "redis", "worker", "total"]
    print(f"µs of CPU per job, {args.jobs} jobs, median of {args.rounds} rounds, one core\n")
    print("| tree | " + " | ".join(parts) + " |")
    print("| --- |" + " ---: |" * len(parts))
    for name, rows in runs.items():
        cells = [f"{statistics.median(r[p] for r in rows):.1f}" for p in parts]
        print(f"| {name} | " + " | ".join(cells) + " |")
    mine, theirs = runs["this tree"], runs[args.against]
    ratios = [
        f"{statistics.median(a[p] / b[p] for a, b in zip(mine, theirs, strict=True)):.2f}x"
        for p in parts
    ]
    print(f"| this ÷ {args.against} | " + " | ".join(ratios) + " |")
    totals = sorted(a["total"] / b["total"] for a, b in zip(mine, theirs, strict=True))
    print(f"\nper-round ratios of the total: {', '.join(f'{t:.2f}' for t in totals)}")


if __name__ == "__main__":
    main()
