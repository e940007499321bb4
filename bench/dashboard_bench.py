"""Dashboard latency with 1,000 tasks and 200 workers recorded (issue 6).

Writes the records into a private Redis server — tasks through ``Client.submit`` (20
subtasks each), then a realistic mix by raw writes: completed tasks with results, running
tasks with node sets and rebalance history, tasks with dead letters, and 200 worker records
with live heartbeats — starts ``python -m queueworks dashboard`` as its own process, and
times every page and API endpoint over keep-alive HTTP (2 warm-up requests, then ``--n``
timed ones each). Fails (exit 1) if any request takes 300 ms or more.

    python bench/dashboard_bench.py [--tasks 1000] [--workers 200] [--n 20]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from queueworks import Client, TaskSpec  # noqa: E402
from queueworks.contrib.redis_server import RedisServer, free_port  # noqa: E402
from queueworks.protocol.models import WorkerRecord  # noqa: E402

LIMIT_MS = 300.0
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/app/jobs.py", line 42, in thumbnail\n'
    "    img = load(payload['path'])\n"
    "ValueError: cannot decode image\n"
)


def populate(client: Client, n_tasks: int, n_workers: int) -> dict[str, str]:
    """Write the records; returns sample task ids by kind."""
    rnd = random.Random(6)
    r, keys = client.redis, client.keys
    ids = []
    for i in range(n_tasks):
        task = client.submit(
            TaskSpec(
                name=f"job-{i:04d}",
                handler="myapp.jobs:thumbnail",
                subtasks=[{"path": f"/data/{i}/{j}.jpg"} for j in range(20)],
                max_nodes=rnd.choice([None, 2, 4, 8]),
                priority=rnd.choice([0, 0, 0, 5, 10]),
            )
        )
        ids.append(task.id)
    workers = [f"worker-{k:03d}" for k in range(n_workers)]
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for k, wid in enumerate(workers):
        rec = WorkerRecord(
            id=wid,
            host=f"host-{k // 8}",
            pid=1000 + k,
            labels={"zone": f"z{k % 3}"},
            started_at=now,
        )
        pipe.hset(
            keys.worker(wid),
            mapping={
                "record": rec.model_dump_json(),
                "state": "idle",
                "task": "",
                "processed": rnd.randint(0, 100_000),
                "last_heartbeat": repr(now),
            },
        )
        pipe.set(keys.worker_heartbeat(wid), repr(now), px=3_600_000)
        pipe.zadd(keys.workers, {wid: now})
    completed, running, dead = ids[:300], ids[300:400], ids[400:450]
    for tid in completed:
        tk = keys.task(tid)
        pipe.hset(tk.record, mapping={"state": "completed", "done": 20, "finished_at": repr(now)})
        pipe.hset(tk.results, mapping={str(j): json.dumps({"ok": j}) for j in range(20)})
        pipe.zrem(keys.queue, tid)
    w = iter(workers * 2)
    for tid in running:
        tk = keys.task(tid)
        members = [next(w) for _ in range(3)]
        pipe.hset(tk.record, mapping={"state": "running", "done": 7, "epoch": 3})
        for epoch, wid in enumerate(members, start=1):
            pipe.zadd(tk.members, {wid: epoch})
            pipe.set(tk.heartbeat(wid), repr(now), px=3_600_000)
            pipe.hset(
                keys.worker(wid),
                mapping={"state": "assigned", "task": tid, "rank": epoch - 1, "epoch": 3},
            )
            pipe.xadd(
                tk.history,
                {"epoch": epoch, "cause": "join", "worker": wid, "ts": repr(now), "size": epoch},
            )
            pipe.xadd(
                tk.history,
                {
                    "epoch": epoch,
                    "cause": "rebalanced",
                    "size": epoch,
                    "pause_ms": rnd.uniform(0.5, 20),
                    "reclaimed": 0,
                    "since_change_ms": rnd.uniform(1, 40),
                    "ts": repr(now),
                },
            )
        pipe.set(tk.epoch, 3)
    for tid in dead:
        tk = keys.task(tid)
        pipe.hset(tk.record, mapping={"state": "running", "done": 10, "dead": 5})
        for j in range(5):
            pipe.xadd(
                tk.dead,
                {
                    "entry": f"0-{j}",
                    "index": j,
                    "reason": "failed 3 times",
                    "error": TRACEBACK,
                    "attempts": 3,
                    "payload": json.dumps({"path": f"/data/{j}.jpg"}),
                    "worker": workers[j],
                    "ts": repr(now),
                },
            )
    for i in range(5000):
        pipe.xadd(keys.events, {"kind": "assigned", "ts": repr(now), "worker": workers[i % 200]})
    pipe.execute()
    # pending entries on the running tasks: delivered to their members, not acked
    for tid in running[:20]:
        tk = keys.task(tid)
        r.xreadgroup(tk.group, workers[0], {tk.stream: ">"}, count=5)
    return {"running": running[0], "dead": dead[0], "completed": completed[0], "queued": ids[-1]}


def time_endpoints(base: str, paths: list[str], n: int) -> list[dict[str, Any]]:
    out = []
    with httpx.Client(base_url=base, timeout=30) as http:
        for path in paths:
            for _ in range(2):
                http.get(path).raise_for_status()
            samples = []
            size = 0
            for _ in range(n):
                t0 = time.perf_counter()
                resp = http.get(path)
                samples.append((time.perf_counter() - t0) * 1000)
                resp.raise_for_status()
                size = len(resp.content)
            samples.sort()
            out.append(
                {
                    "path": path,
                    "p50_ms": round(statistics.median(samples), 1),
                    "p95_ms": round(samples[int(0.95 * (len(samples) - 1))], 1),
                    "max_ms": round(samples[-1], 1),
                    "kb": round(size / 1024, 1),
                }
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=200)
    ap.add_argument("--n", type=int, default=20, help="timed requests per endpoint")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    with RedisServer() as server:
        server.start()
        client = Client.from_url(server.url, prefix=prefix)
        t0 = time.perf_counter()
        sample = populate(client, args.tasks, args.workers)
        print(
            f"wrote {args.tasks} tasks, {args.workers} workers in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
        port = free_port()
        env = {
            **os.environ,
            "QUEUEWORKS_REDIS_URL": server.url,
            "QUEUEWORKS_PREFIX": prefix,
            "QUEUEWORKS_LOG_LEVEL": "warning",
            "PYTHONPATH": str(ROOT),
        }
        dash = subprocess.Popen(
            [sys.executable, "-m", "queueworks", "dashboard", "--port", str(port)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    httpx.get(f"{base}/healthz", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            paths = [
                "/",
                "/tasks",
                "/tasks?state=running",
                "/tasks?state=all&page=10",
                f"/tasks/{sample['running']}",
                f"/tasks/{sample['dead']}",
                f"/tasks/{sample['completed']}",
                "/workers",
                "/metrics",
                "/api/overview",
                "/api/tasks",
                f"/api/tasks/{sample['running']}",
                "/api/workers",
                "/api/events",
            ]
            rows = time_endpoints(base, paths, args.n)
        finally:
            dash.terminate()
            dash.wait(10)
            client.close()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        title = f"endpoint ({args.tasks} tasks, {args.workers} workers)"
        print(f"| {title} | p50 ms | p95 ms | max ms | KB |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for row in rows:
            path = row["path"].replace(sample["running"], "{running}")
            path = path.replace(sample["dead"], "{with dead letters}")
            path = path.replace(sample["completed"], "{completed}")
            print(
                f"| `{path}` | {row['p50_ms']} | {row['p95_ms']} | {row['max_ms']} | {row['kb']} |"
            )
    slow = [row for row in rows if row["max_ms"] >= LIMIT_MS]
    if slow:
        print(f"FAIL: {len(slow)} endpoint(s) took {LIMIT_MS} ms or more: {slow}", file=sys.stderr)
        return 1
    print(f"ok: every request under {LIMIT_MS:.0f} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
