"""Flow control: a queue's ``rate_limit`` and ``group_limit`` on real workers, and an
unlimited queue's throughput beside another tree's (before the limits existed).

    python -m bench.flow                          # (a) and (b), then (c) against /work/main
    python -m bench.flow --against ../main --rounds 3

(a) **Rate.** 2 workers at ``--concurrency 10``; a queue with ``rate_limit=50``; 200 jobs
that note their start (``tests.handlers_flow:noted``) enqueued at once. The rate is the
starts after the first over the time from the first to the last (the burst, 5 jobs, is
in it), and the whole: 200 jobs over the time from the enqueue to the last start.

(b) **Groups.** The same workers; a queue with ``group_limit=2``; 5 groups x 20 jobs of
0.1 s enqueued round robin. The most jobs of one group that ran at once (each job counts
its group's running jobs in Redis as it starts), and the time from the enqueue to the
last job done against the ideal: 20 jobs / 2 at once x 0.1 s = 1.0 s.

(c) **Unlimited queues unchanged.** 2 workers (``--concurrency 1``), 20,000 no-op jobs
(``enqueue_many``) on a queue with no limit: jobs/s from the enqueue to the last settled,
with the workers of this tree and of ``--against`` (fresh processes, same Redis build),
interleaved over ``--rounds``, the order reversed every other round; the ratio is the
median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from bench.common import Procs, private_redis, wait_for, wait_workers
from queueworks import Client
from tests.handlers_flow import read_log

ROOT = Path(__file__).resolve().parent.parent
NOTED = "tests.handlers_flow:noted"
NOOP = "bench.shared_jobs:noop"


class TreeProcs(Procs):
    """``Procs`` whose processes run the code of ``tree`` (``python -m`` puts its working
    directory first on the path)."""

    def __init__(self, url: str, prefix: str, tree: Path) -> None:
        super().__init__(url, prefix, {"PYTHONPATH": str(tree)})
        self.tree = tree

    def spawn(self, *args: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            [sys.executable, "-m", "queueworks", *args],
            env=self.env,
            cwd=self.tree,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.all.append(p)
        return p


@contextmanager
def rig(url: str, tree: Path, concurrency: int) -> Iterator[tuple[Client, redis.Redis, str]]:
    prefix = f"bf{uuid.uuid4().hex[:6]}"
    procs = TreeProcs(url, prefix, tree)
    r = redis.Redis.from_url(url)
    client = Client.from_url(url, prefix=prefix)
    try:
        procs.spawn("controller")
        for i in range(2):
            allow = ("--allow", "tests.handlers_flow", "--allow", "bench.shared_jobs")
            procs.worker(f"w{i}", *allow, "--concurrency", str(concurrency))
        wait_workers(r, prefix, 2)
        yield client, r, prefix
    finally:
        procs.stop_all()
        client.close()
        r.close()


def _members(client: Client, name: str, **settings: Any) -> Any:
    q = client.queue(name, min_nodes=2, **settings)
    wait_for(lambda: len(q.status().nodes) == 2, 30)
    return q


def rate(client: Client, r: redis.Redis, prefix: str, limit: float, n: int) -> dict[str, Any]:
    q = _members(client, "rated", rate_limit=limit)
    log = f"{prefix}:rate"
    t0 = time.time()
    q.enqueue_many((NOTED, {"log": log}) for _ in range(n))
    wait_for(lambda: q.status().done >= n, 120)
    starts = sorted(read_log(r, log)[0][""])
    return {
        "limit": limit,
        "jobs": n,
        "rate": round((n - 1) / (starts[-1] - starts[0]), 2),
        "whole": round(n / (starts[-1] - t0), 2),
    }


def groups(client: Client, r: redis.Redis, prefix: str, n_groups: int, each: int) -> dict[str, Any]:
    q = _members(client, "grouped", group_limit=2)
    log, seconds = f"{prefix}:groups", 0.1
    t0 = time.time()
    for _ in range(each):
        for g in range(n_groups):
            q.enqueue(NOTED, {"log": log, "group": f"g{g}", "seconds": seconds}, group=f"g{g}")
    wait_for(lambda: q.status().done >= n_groups * each, 120, interval=0.005)
    took = time.time() - t0
    _, peaks = read_log(r, log)
    ideal = each / 2 * seconds
    return {
        "seconds": round(took, 3),
        "ideal": ideal,
        "ratio": round(took / ideal, 2),
        "peak": max(peaks.values()),
    }


def throughput(url: str, tree: Path, n: int) -> float:
    with rig(url, tree, 1) as (client, _, _):
        q = _members(client, "free")
        t0 = time.perf_counter()
        for first in range(0, n, 1000):
            q.enqueue_many((NOOP, {"i": i}) for i in range(first, min(n, first + 1000)))
        wait_for(lambda: q.status().done >= n, 300, interval=0.005)
        return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", type=Path, default=ROOT.parent.parent / "main")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=20_000)
    args = ap.parse_args(argv)
    with private_redis() as server:
        url = server.url
        with rig(url, ROOT, 10) as (client, r, prefix):
            a = rate(client, r, prefix, 50.0, 200)
            b = groups(client, r, prefix, 5, 20)
        print(f"(a) rate_limit=50, 200 jobs, 2 workers x 10: {a}")
        print(f"(b) group_limit=2, 5 groups x 20 jobs of 0.1 s: {b}")
        here, there, ratios = [], [], []
        for k in range(args.rounds):
            order = [ROOT, args.against] if k % 2 == 0 else [args.against, ROOT]
            got = {tree: throughput(url, tree, args.jobs) for tree in order}
            here.append(got[ROOT])
            there.append(got[args.against])
            ratios.append(got[ROOT] / got[args.against])
            print(f"(c) round {k + 1}: this tree {here[-1]:.0f} jobs/s, against {there[-1]:.0f}")
        print(
            f"(c) unlimited queue, {args.jobs} no-op jobs, 2 workers: this tree "
            f"{statistics.median(here):.0f} jobs/s ({min(here):.0f} to {max(here):.0f}), against "
            f"{statistics.median(there):.0f} ({min(there):.0f} to {max(there):.0f}); ratio "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}x to {max(ratios):.2f}x)"
        )


if __name__ == "__main__":
    main()
