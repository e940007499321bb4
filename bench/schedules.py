"""What periodic jobs cost the controller: a pass with 10,000 schedules none of which is due,
and firing a batch that is; and how a live controller keeps time.

    python -m bench.schedules                  # 10,000 schedules over 100 queues
    python -m bench.schedules --n 50000 --passes 2000
    python -m bench.schedules --live 0.001,0.01,0.1 --seconds 6   # a live controller only

On one private Redis: ``--n`` schedules (every hour: none due) on ``--queues`` queues, then
``--passes`` controller passes of ``controller.scheduler.Scheduler`` under a real lease. A
*forced* pass reads the index as a pass does when an event woke it or its recheck interval
came (one ``ZRANGE 0 0``); a *cached* pass is one between two such reads (the earliest due
time is known: no read). Then ``--due`` schedules are made due and fired in one pass.

Live (``--live EVERY,...``): on another private Redis with its defaults (``hz 10``), a real
controller process leads; for each ``every`` one schedule runs ``--seconds`` s (no worker:
its jobs stay in the queue's stream). *Fired* is the share of its due times on the grid up
to the last one fired that got their job; *late* is each job's stream entry time (Redis' clock
at the ``XADD``) minus its due time.
"""

from __future__ import annotations

import argparse
import time
import uuid

from bench.common import Procs, pct, private_redis, wait_for
from queueworks import Client
from queueworks.controller.fence import Fence
from queueworks.controller.scheduler import Scheduler
from queueworks.controller.tally import Tally
from queueworks.logs import get_logger
from queueworks.queue.schedules import member
from queueworks.scripts.bound import Scripts


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
    ap.add_argument("--live", default="0.001,0.01,0.1", help="every= values; '' for none")
    ap.add_argument("--seconds", type=float, default=6.0, help="each live schedule runs so long")
    ap.add_argument("--live-only", action="store_true", help="skip the passes")
    a = ap.parse_args()
    if not a.live_only:
        passes(a)
    if a.live:
        live([float(x) for x in a.live.split(",")], a.seconds)


def passes(a: argparse.Namespace) -> None:
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


def live(everies: list[float], seconds: float) -> None:
    with private_redis() as server:
        prefix = f"b{uuid.uuid4().hex[:8]}"
        client = Client.from_url(server.url, prefix=prefix)
        r, keys = client.redis, client.keys
        procs = Procs(server.url, prefix)
        procs.spawn("controller")
        try:
            wait_for(lambda: r.exists(keys.leader), 30)
            one_live(client, 0.01, 0.5)  # the leader's first pass has run: it watches
            print(f"a live controller, one schedule at a time, {seconds:g} s each:")
            for every in everies:
                fired, late = one_live(client, every, seconds)
                print(
                    f"  every={every:<6g} fired {fired:6.1%}  late p50 {pct(late, 50):6.2f} ms"
                    f"  p99 {pct(late, 99):6.2f}  max {max(late, default=0):6.2f}"
                )
        finally:
            procs.stop_all()
            client.close()


def one_live(client: Client, every: float, seconds: float) -> tuple[float, list[float]]:
    """(the share of due times fired, each job's lateness in ms) for one schedule."""
    name = f"live{uuid.uuid4().hex[:6]}"
    q = client.queue(name)
    made = q.schedule("tick", "queueworks.examples:double", {"x": 1}, every=every)
    assert made.next_run is not None
    time.sleep(seconds)
    q.unschedule("tick")
    time.sleep(0.2)  # a fire under way when it was removed lands
    late, last = [], 0.0
    for entry_id, fields in client.redis.xrange(client.keys.task(name).stream):
        due = float(fields[b"t"]) * 1000
        late.append(int(entry_id.split(b"-")[0]) - due)
        last = max(last, due)
    q.task.cancel()
    grid = round((last - made.next_run * 1000) / (every * 1000)) + 1  # up to the last fired
    return len(late) / max(1, grid), late


if __name__ == "__main__":
    main()
