"""I/O-bound jobs on async workers: N jobs that each ``await asyncio.sleep(s)``, on W workers
with ``--concurrency C``, from enqueue of the first to the result of the last.

    python -m bench.async_jobs                       # 200 jobs of 0.5 s, 2 workers x 50
    python -m bench.async_jobs --jobs 200 --seconds 0.5 --workers 2 --concurrency 50 --repeat 3

The workers are real processes on a private redis-server, warm (each has run a job) and
already in the queue's node set when the clock starts; jobs are enqueued one call each.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import redis

from bench.common import Procs, private_redis, wait_for, wait_workers
from queueworks import Client


def run(url: str, jobs: int, seconds: float, workers: int, concurrency: int) -> float:
    prefix = f"a{uuid.uuid4().hex[:6]}"
    procs = Procs(url, prefix)
    r = redis.Redis.from_url(url)
    try:
        procs.spawn("controller")
        for i in range(workers):
            procs.worker(f"w{i}", "--concurrency", str(concurrency))
        wait_workers(r, prefix, workers)
        client = Client.from_url(url, prefix=prefix)
        q = client.queue("io")
        warm = [q.enqueue("queueworks.examples:wait", {"seconds": 0.01}) for _ in range(workers)]
        for job in warm:
            job.result(timeout=60)
        wait_for(lambda: len(q.status().nodes) == workers, 30)
        started = time.perf_counter()
        batch = [q.enqueue("queueworks.examples:wait", {"seconds": seconds}) for _ in range(jobs)]
        for job in batch:
            assert job.result(timeout=120) == seconds
        took = time.perf_counter() - started
        assert q.status().done == jobs + len(warm)
        return took
    finally:
        procs.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with private_redis() as server:
        times = [
            run(server.url, args.jobs, args.seconds, args.workers, args.concurrency)
            for _ in range(args.repeat)
        ]
    ideal = args.seconds * -(-args.jobs // (args.workers * args.concurrency))
    print(
        f"{args.jobs} jobs of {args.seconds} s, {args.workers} workers x --concurrency "
        f"{args.concurrency}: median {statistics.median(times):.2f} s, best {min(times):.2f} s "
        f"(runs: {', '.join(f'{t:.2f}' for t in times)}; waiting alone: {ideal:.2f} s; one at "
        f"a time: {args.jobs * args.seconds / args.workers:.0f} s)"
    )


if __name__ == "__main__":
    main()
