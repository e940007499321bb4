"""Membership benchmarks with real processes and real signals:

- kill-to-reclaim: SIGKILL a member holding a subtask; time until that subtask starts
  again on a survivor (p50/p99 over --kills kills), at default and fast heartbeat settings;
- graceful rebalance pause: SIGTERM a member; time until every survivor reports the new
  epoch with ranks 0..n-2 (and the leader's recorded pause);
- join latency: a worker registers; time until it starts its first subtask.

    python -m bench.elastic --kills 20 --leaves 20
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import time
import uuid

import redis

from bench.common import Procs, pct, private_redis, wait_for, wait_workers
from queueworks import Client, TaskSpec
from queueworks.protocol.keys import Keys


def runs(r: redis.Redis, log: str) -> list[tuple[int, str, float]]:
    out = []
    for raw in r.lrange(log, 0, -1):
        i, w, _a, _e, _rk, _ws, t = raw.decode().split("|")
        out.append((int(i), w, float(t)))
    return out


def scenario(url: str, kills: int, leaves: int, hb: tuple[float, float]) -> dict[str, list[float]]:
    prefix = f"e{uuid.uuid4().hex[:6]}"
    keys = Keys(prefix)
    interval, ttl = hb
    procs = Procs(
        url,
        prefix,
        {"QUEUEWORKS_HEARTBEAT_INTERVAL": str(interval), "QUEUEWORKS_HEARTBEAT_TTL": str(ttl)},
    )
    r = redis.Redis.from_url(url)
    rng = random.Random(5)
    out: dict[str, list[float]] = {"reclaim": [], "pause": [], "leader_pause_ms": [], "join": []}
    try:
        procs.spawn("controller")
        names = [f"w{i}-{uuid.uuid4().hex[:4]}" for i in range(4)]
        live = {n: procs.worker(n) for n in names}
        wait_workers(r, prefix, 4)
        client = Client.from_url(url, prefix=prefix)
        log = f"{prefix}:log"
        task = client.submit(
            TaskSpec(
                name="bench",
                handler="tests.handlers:tracked",
                subtasks=({"x": i, "log": log, "seconds": 0.02} for i in range(10**6)),
                max_attempts=100,
            )
        )
        wait_for(lambda: len(task.status().nodes) == 4, 30)

        def replace() -> None:
            name = f"w-{uuid.uuid4().hex[:6]}"
            live[name] = procs.worker(name)
            rec = wait_for(lambda: r.hget(keys.worker(name), "record"), 30, 0.002)
            t_reg = json.loads(rec)["started_at"]
            first = wait_for(lambda: [t for _, w, t in runs(r, log) if w == name], 30, 0.005)
            out["join"].append(min(first) - t_reg)

        results_key = keys.task(task.id).results
        while len(out["reclaim"]) < kills:
            time.sleep(0.5)
            name = rng.choice(sorted(live))
            t_kill = time.time()
            live.pop(name).kill()
            # what the victim started and never settled: it must run again elsewhere
            started = {i: t for i, w, t in runs(r, log) if w == name and t < t_kill}
            unsettled = [i for i in started if not r.hexists(results_key, i)]
            if unsettled:
                index = max(unsettled, key=lambda i: started[i])
                again = wait_for(
                    lambda index=index, t_kill=t_kill: [  # type: ignore[misc]
                        t for i, _, t in runs(r, log) if i == index and t > t_kill
                    ],
                    60,
                    0.01,
                )
                out["reclaim"].append(min(again) - t_kill)
            replace()
            wait_for(lambda: len(task.status().nodes) == 4, 30)
        for _ in range(leaves):
            time.sleep(0.3)
            name = rng.choice(sorted(live))
            staying = [n for n in live if n != name]
            before = task.status().epoch
            t0 = time.monotonic()
            live.pop(name).send_signal(signal.SIGTERM)

            def settled(staying: list[str] = staying, before: int = before) -> bool:
                pipe = r.pipeline()
                for n in staying:
                    pipe.hmget(keys.worker(n), ["rank", "epoch"])
                got = [(int(a), int(b)) for a, b in pipe.execute() if a and b]
                return (
                    len(got) == len(staying)
                    and len({e for _, e in got}) == 1
                    and got[0][1] > before
                    and sorted(a for a, _ in got) == list(range(len(staying)))
                )

            wait_for(settled, 30, 0.002)
            out["pause"].append(time.monotonic() - t0)
            replace()
            wait_for(lambda: len(task.status().nodes) == 4, 30)
        for _, e in r.xrange(keys.task(task.id).history):
            if e.get(b"cause") == b"rebalanced":
                out["leader_pause_ms"].append(float(e[b"pause_ms"]))
        task.cancel()
        return out
    finally:
        procs.stop_all()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--leaves", type=int, default=20)
    args = ap.parse_args()
    with private_redis() as server:
        for hb in ((1.0, 3.0), (0.25, 1.0)):
            res = scenario(server.url, args.kills, args.leaves, hb)
            print(f"heartbeat interval {hb[0]} s, TTL {hb[1]} s:")
            for name, unit, scale in (
                ("reclaim", "s", 1),
                ("pause", "ms", 1000),
                ("leader_pause_ms", "ms", 1),
                ("join", "ms", 1000),
            ):
                v = [x * scale for x in res[name]]
                print(
                    f"  {name:<16} n={len(v):>3}  p50 {pct(v, 50):8.1f} {unit}  "
                    f"p99 {pct(v, 99):8.1f} {unit}  max {max(v):8.1f} {unit}"
                )


if __name__ == "__main__":
    main()
