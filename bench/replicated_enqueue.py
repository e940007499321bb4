"""What ``wait_replicas`` costs an enqueue: a single ``Queue.enqueue`` (latency) and
``enqueue_many`` (throughput), plain and with ``wait_replicas=1``, on a local primary with
one replica (private servers this script starts and stops). Not a test.

    python -m bench.replicated_enqueue [--singles 2000] [--many 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from queueworks import Client
from queueworks.contrib.redis_server import RedisServer


def synced(replica: RedisServer) -> None:
    with replica.client() as c:
        deadline = time.monotonic() + 30
        while c.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise SystemExit("the replica never synced")
            time.sleep(0.05)


def singles(q: Any, n: int, replicas: int) -> list[float]:
    """The latency of each of ``n`` enqueues, in µs."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        q.enqueue("m:f", {"i": i}, wait_replicas=replicas)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def many(q: Any, n: int, replicas: int) -> float:
    """Jobs a second of one ``enqueue_many`` of ``n``."""
    t0 = time.perf_counter()
    q.enqueue_many((("m:f", {"i": i}) for i in range(n)), wait_replicas=replicas)
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--singles", type=int, default=2000)
    ap.add_argument("--many", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    primary = RedisServer()
    primary.start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
    replica.start()
    try:
        synced(replica)
        with Client.from_url(primary.url, prefix=f"b{uuid.uuid4().hex[:8]}") as c:
            q = c.queue("bench", wait_timeout=5.0)
            q.enqueue_many(("m:f", i) for i in range(100))  # warm: scripts, handlers known
            for replicas in (0, 1, 0, 1):
                singles(q, 200, replicas)
            for label, replicas in (("plain", 0), ("wait_replicas=1", 1)):
                lat = [x for _ in range(args.rounds) for x in singles(q, args.singles, replicas)]
                rates = [many(q, args.many, replicas) for _ in range(args.rounds)]
                lat.sort()
                print(
                    f"{label:16} enqueue: median {statistics.median(lat):7.0f} µs, "
                    f"p99 {lat[int(len(lat) * 0.99)]:7.0f} µs | enqueue_many({args.many}): "
                    f"{statistics.median(rates):9.0f} jobs/s (best {max(rates):.0f})"
                )
    finally:
        replica.close()
        primary.close()


if __name__ == "__main__":
    main()
