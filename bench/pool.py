"""CPU-bound jobs on one worker process against a pool (``queueworks worker --processes N``).

    python -m bench.pool                           # 400 jobs of ~20 ms, 1 and 2 processes
    python -m bench.pool --jobs 800 --ms 20 --processes 2 --rounds 5

Each round runs every pool size in turn (the order reversed every other round), each on a
fresh private redis-server with a controller: ``queueworks worker --processes P --allow
bench.pool``, a few jobs until its P members serve the queue, then ``--jobs`` jobs, each a
pure-Python loop of about ``--ms`` ms (it holds the GIL: one process runs one at a time),
enqueued at once; timed from the first enqueue to the last job done. Prints the jobs/s of
each size and the speed-up of each over one process: medians over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import Procs, private_redis, wait_for
from queueworks import Client


def spin(payload: dict[str, Any]) -> int:
    """The job: ``n`` turns of a pure-Python loop."""
    total = 0
    for i in range(int(payload["n"])):
        total += i * i % 7
    return total


def turns_for(ms: float) -> int:
    """How many turns of ``spin`` take about ``ms`` ms here."""
    n = 100_000
    start = time.perf_counter()
    spin({"n": n})
    spent = time.perf_counter() - start
    return max(1, int(n * ms / 1000 / spent))


def one_run(processes: int, jobs: int, turns: int) -> float:
    """Jobs per second of a pool of ``processes`` on a fresh server."""
    with private_redis() as server:
        procs = Procs(server.url, "qw")
        try:
            procs.spawn("controller")
            procs.spawn("worker", "--processes", str(processes), "--allow", "bench.pool")
            client = Client.from_url(server.url, prefix="qw")
            q = client.queue("cpu", max_attempts=1)
            warm = [q.enqueue("bench.pool:spin", {"n": 1}) for _ in range(processes * 4)]
            for job in warm:
                job.result(timeout=120)
            wait_for(lambda: len(q.status().nodes) == processes, 120, 0.05)
            start = time.perf_counter()
            q.enqueue_many(("bench.pool:spin", {"n": turns}) for _ in range(jobs))
            done = q.status().done + jobs
            wait_for(lambda: q.status().done >= done, 600, 0.01)
            rate = jobs / (time.perf_counter() - start)
            client.close()
            return rate
        finally:
            procs.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=400, help="jobs per run [400]")
    ap.add_argument("--ms", type=float, default=20.0, help="CPU per job, ms [20]")
    ap.add_argument("--processes", type=int, default=2, help="the pool beside 1 process [2]")
    ap.add_argument("--rounds", type=int, default=3, help="rounds [3]")
    args = ap.parse_args()
    turns = turns_for(args.ms)
    sizes = [1, args.processes]
    rates: dict[int, list[float]] = {p: [] for p in sizes}
    for k in range(args.rounds):
        for p in sizes if k % 2 == 0 else sizes[::-1]:
            rates[p].append(one_run(p, args.jobs, turns))
            print(f"round {k + 1}: {p} process(es): {rates[p][-1]:.1f} jobs/s", flush=True)
    one = statistics.median(rates[1])
    for p in sizes:
        ratio = statistics.median(r / base for r, base in zip(rates[p], rates[1], strict=True))
        print(
            f"{p} process(es): {statistics.median(rates[p]):.1f} jobs/s "
            f"({ratio:.2f}x one process; one: {one:.1f} jobs/s)"
        )


if __name__ == "__main__":
    main()
