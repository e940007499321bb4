"""What periodic jobs cost the controller: a pass with 10,000 schedules none of which is due,
and firing a batch that is.

    python -m bench.schedules                  # 10,000 schedules over 100 queues
    python -m bench.schedules --n 50000 --passes 2000

On one private Redis: ``--n`` schedules (every hour: none due) on ``--queues`` queues, then
``--passes`` controller passes of ``controller.scheduler.Scheduler`` under a real lease. A
*forced* pass reads the index as a pass does when an event woke it or its recheck interval
came (one ``ZRANGE 0 0``); a *cached* pass is one between two such reads (the earliest due
time is known: no read). Then ``--due`` schedules are made due and fired in one pass.
"""

from __future__ import annotations

import argparse
import time
import uuid

from bench.common import pct, private_redis
from queueworks import Client
from queueworks.controller.fence import Fence
from queueworks.controller.scheduler import Scheduler
from queueworks.controller.tally import Tally
from queueworks.logs import get_logger
from queueworks.schedules import member
from queueworks.scripts import Scripts


def timed(fn: object, passes: int) -> list[float]:
    out = []
    for _ in range(passes):
        started = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - started) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--passes", type=int, default=1000)
    ap.add_argument("--due", type=int, default=500)
    a = ap.parse_args()
    with private_redis() as server:
        prefix = f"b{uuid.uuid4().hex[:8]}"
        client = Client.from_url(server.url, prefix=prefix)
        r, keys = client.redis, client.keys
        queues = [client.queue(f"q{i}") for i in range(a.queues)]
        for i in range(a.n):
            queues[i % a.queues].schedule(
                f"s{i}", "queueworks.examples:double", {"x": i}, every=3600
            )
        scripts = Scripts(r)
        term, token = scripts.lease_acquire(keys.leader, keys.leader_term, "bench", 600_000)
        fence = Fence(r, keys, scripts, Tally())
        fence.arm(token, term)
        s = Scheduler(r, keys, fence, get_logger(), Tally(), held=lambda: True)
        s.step(woken=True)
        forced = timed(lambda: s.step(woken=True), a.passes)
        cached = timed(s.step, a.passes)
        print(f"{a.n} schedules on {a.queues} queues, none due, {a.passes} passes each:")
        for name, xs in (("forced (one read)", forced), ("cached (no read)", cached)):
            mean = sum(xs) / len(xs)
            print(f"  {name:<18} mean {mean:.3f} ms  p50 {pct(xs, 50):.3f}  p99 {pct(xs, 99):.3f}")
        now = round(time.time() * 1000) - 1
        pipe = r.pipeline(transaction=False)
        for i in range(a.due):
            q = f"q{i % a.queues}"
            pipe.zadd(keys.task(q).schedules_due, {f"s{i}": now})
            pipe.zadd(keys.schedules, {member(q, f"s{i}"): now})
        pipe.execute()
        started = time.perf_counter()
        fired = s.step(woken=True)
        took = (time.perf_counter() - started) * 1000
        print(
            f"  {fired} due fired in one pass: {took:.1f} ms ({took / max(1, fired):.3f} ms each)"
        )
        client.close()


if __name__ == "__main__":
    main()
